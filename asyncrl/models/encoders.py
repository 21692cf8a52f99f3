"""Observation encoders: the Nature CNN for stacked frames, an MLP for vectors, and one of each per key of a Dict
observation."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from asyncrl.envs.base import ObsKey


class NatureCNN(nn.Module):
    """Mnih et al. 2015: three conv layers and a 512-unit layer; uint8 frames are scaled to [0, 1] inside."""

    def __init__(self, in_channels: int, height: int, width: int, out_features: int = 512):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = self.conv(torch.zeros(1, in_channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, out_features), nn.ReLU())
        self.out_features = out_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.conv[0].weight.is_contiguous(memory_format=torch.channels_last):
            obs = obs.contiguous(memory_format=torch.channels_last)  # convert the uint8 frames: 4x less to copy
        device = obs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
        return self.fc(self.conv(obs.to(dtype) * (1.0 / 255.0)))  # under autocast: straight to bf16


class MLP(nn.Module):
    """Two tanh layers, as in most PPO baselines for low-dimensional control."""

    def __init__(self, in_features: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.out_features = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float().flatten(1))


class DictEncoder(nn.Module):
    """One encoder per key of a Dict observation (the Nature CNN for images, the MLP for vectors), in the space's
    key order; their float32 outputs are concatenated. Under a compute dtype (bf16) only the CNNs autocast.

    As for single observations, images share their CNN between policy and value, while each vector key has a
    policy MLP and a separate value MLP (`value_features`), so large returns cannot swamp the policy's features.
    """

    def __init__(self, keys: tuple[ObsKey, ...], hidden: int = 64):
        super().__init__()
        self.image_keys = frozenset(k.key for k in keys if k.image)
        self.encoders = nn.ModuleDict({
            k.key: NatureCNN(*k.shape) if k.image else MLP(int(np.prod(k.shape)), hidden) for k in keys
        })
        self.value_encoders = nn.ModuleDict({k.key: MLP(int(np.prod(k.shape)), hidden) for k in keys if not k.image})
        self.out_features = sum(e.out_features for e in self.encoders.values())

    def forward(self, obs: dict[str, torch.Tensor], compute_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The policy's features."""
        return torch.cat(list(self._policy_parts(obs, compute_dtype).values()), dim=-1)

    def both(self, obs: dict[str, torch.Tensor],
             compute_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's and the value's features (the CNNs run once for both)."""
        parts = self._policy_parts(obs, compute_dtype)
        value_parts = [self.value_encoders[k](obs[k]).float() if k in self.value_encoders else x
                       for k, x in parts.items()]
        return torch.cat(list(parts.values()), dim=-1), torch.cat(value_parts, dim=-1)

    def _policy_parts(self, obs: dict[str, torch.Tensor], compute_dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        parts = {}
        for key, encoder in self.encoders.items():
            x = obs[key]
            if compute_dtype is not None and key in self.image_keys:
                with torch.autocast(x.device.type, dtype=compute_dtype):
                    parts[key] = encoder(x).float()
            else:
                parts[key] = encoder(x).float()
        return parts
