"""Observation encoders: the Nature CNN and the IMPALA ResNet for stacked frames, an MLP for vectors, one of them per
key of a Dict observation, and a user's module (`--encoder module:callable`).

Each built-in has a factory `name(obs_shape, hidden_size) -> nn.Module` (the signature of a user's factory,
`asyncrl/models/registry.py`), registered by name in `asyncrl.models.registry.ENCODERS`. Every encoder has
`out_features`, the width of the float features it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncrl.envs.base import EnvSpec, ObsKey

EncoderFactory = Callable[[Any, int], nn.Module]  # (obs_shape, hidden_size) -> module


class FrameEncoder(nn.Module):
    """A convolution stack over frames (`conv`, ending in a flatten) and a ReLU linear layer of `out_features` on
    its output; uint8 frames are scaled to [0, 1] inside (`input_scale`; 1.0 where the model's observation
    normaliser has already standardised each pixel)."""

    def __init__(self, conv: nn.Sequential, in_channels: int, height: int, width: int, out_features: int):
        super().__init__()
        self.input_scale = 1.0 / 255.0
        self.conv = conv
        with torch.no_grad():
            n_flat = self.conv(torch.zeros(1, in_channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, out_features), nn.ReLU())
        self.out_features = out_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.conv[0].weight.is_contiguous(memory_format=torch.channels_last):
            obs = obs.contiguous(memory_format=torch.channels_last)  # convert the uint8 frames: 4x less to copy
        return self.fc(self.conv(_float_frames(obs, self.input_scale)))  # under autocast: straight to bf16


class NatureCNN(FrameEncoder):
    """Mnih et al. 2015: three conv layers and a 512-unit layer; uint8 frames are scaled to [0, 1] inside."""

    def __init__(self, in_channels: int, height: int, width: int, out_features: int = 512):
        conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        super().__init__(conv, in_channels, height, width, out_features)


def _float_frames(obs: torch.Tensor, scale: float) -> torch.Tensor:
    """Frames times `scale` (uint8 by 1/255: [0, 1]), in the autocast dtype when autocast is on (bf16 straight
    away)."""
    device = obs.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    return obs.to(dtype) if scale == 1.0 else obs.to(dtype) * scale


class ResidualBlock(nn.Module):
    """IMPALA's residual block: x + conv(relu(conv(relu(x)))), 3x3 convolutions keeping the channels."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(FrameEncoder):
    """The IMPALA ResNet (Espeholt et al. 2018): three stacks of a 3x3 convolution, a 3x3 max-pool of stride 2 and
    two residual blocks (16, 32 and 32 channels), then ReLU, a linear layer of `out_features` (the paper's 256)
    and ReLU. uint8 frames are scaled to [0, 1] inside, as in the Nature CNN."""

    def __init__(self, in_channels: int, height: int, width: int, out_features: int = 256,
                 channels: tuple[int, ...] = (16, 32, 32)):
        layers: list[nn.Module] = []
        depth = in_channels
        for out in channels:
            layers += [nn.Conv2d(depth, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out), ResidualBlock(out)]
            depth = out
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), in_channels, height, width, out_features)


class Tanh(nn.Module):
    """tanh(x) computed as 2 sigmoid(2x) - 1: the same function (to float32 rounding) at under half the cost on
    CPUs, where torch's sigmoid is vectorised and its tanh is not (4.1 against 1.2 ns an element on the 2-core
    AVX2 development machine); the two tanh layers set the pace of MLP inference with thousands of envs. Learning
    uses the composition too: with torch's tanh there, the 4,096-env CartPole training row fell from 236k to 162k
    agent steps/s (although an update on random observations alone ran faster with it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return 2.0 * torch.sigmoid(2.0 * x) - 1.0
        return torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)  # no graph: in place on the fresh sigmoid output


class MLP(nn.Module):
    """Two hidden layers: tanh, as in most PPO baselines for low-dimensional control, or ReLU (`--activation`)."""

    def __init__(self, in_features: int, hidden: int = 64, activation: str = "tanh"):
        super().__init__()
        unit = {"tanh": Tanh, "relu": nn.ReLU}[activation]
        self.net = nn.Sequential(nn.Linear(in_features, hidden), unit(), nn.Linear(hidden, hidden), unit())
        self.out_features = hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float().flatten(1))


def nature_cnn(obs_shape: tuple[int, ...], hidden_size: int) -> NatureCNN:
    """`--encoder nature`: the Nature CNN on (C, H, W) frames (its 512 units; `hidden_size` sizes MLPs only)."""
    return NatureCNN(*obs_shape)


def impala_cnn(obs_shape: tuple[int, ...], hidden_size: int) -> ImpalaCNN:
    """`--encoder impala`: the IMPALA ResNet on (C, H, W) frames (its 256 units; `hidden_size` sizes MLPs only)."""
    return ImpalaCNN(*obs_shape)


def mlp(obs_shape: tuple[int, ...], hidden_size: int) -> MLP:
    """`--encoder mlp`: two tanh layers of `hidden_size` units on the flattened observation."""
    return MLP(int(np.prod(obs_shape)), hidden_size)


class EncoderError(ValueError):
    """A user's encoder that cannot be built or whose output does not fit (one line)."""


class UserEncoder(nn.Module):
    """A user's `--encoder module:callable` module, shared by policy and value (as the CNNs are): raw observations
    (a dict of them for a Dict observation) -> float32 features [N, out_features].

    Built on a dummy batch of two zero observations at construction; EncoderError (one line) if the factory
    fails or its output is not float features of shape [2, F].
    """

    def __init__(self, name: str, factory: EncoderFactory, spec: EnvSpec, hidden_size: int):
        super().__init__()
        shape: Any = {k.key: tuple(k.shape) for k in spec.feature_keys} if spec.is_dict else tuple(spec.obs_shape)
        try:
            module = factory(shape, hidden_size)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's code is reported in one line
            raise EncoderError(f"--encoder {name}: {name}({shape}, {hidden_size}) raised "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
        if not isinstance(module, nn.Module):
            raise EncoderError(f"--encoder {name}: the factory returned {type(module).__name__}, not a "
                               f"torch.nn.Module")
        self.module = module
        self.dict_obs = spec.is_dict
        if spec.is_dict:
            dummy: Any = {k.key: torch.zeros((2, *k.shape), dtype=_torch_dtype(k.dtype)) for k in spec.feature_keys}
        else:
            dummy = torch.zeros((2, *spec.obs_shape), dtype=_torch_dtype(spec.obs_dtype))
        try:
            with torch.no_grad():
                out = module(dummy)
        except Exception as exc:  # noqa: BLE001
            raise EncoderError(f"--encoder {name}: the module fails on a batch of 2 observations of shape "
                               f"{shape}: {type(exc).__name__}: {_first_line(exc)}") from None
        if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == 2 and out.shape[1] > 0
                and out.dtype.is_floating_point):
            got = f"a {out.dtype} tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else \
                type(out).__name__
            raise EncoderError(f"--encoder {name}: for a batch of 2 observations of shape {shape} the module "
                               f"returns {got}; it must return float features of shape [2, F]")
        self.out_features = int(out.shape[1])

    def forward(self, obs: Any, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.module(obs).float()

    def both(self, obs: dict[str, torch.Tensor],
             compute_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy and value features (one and the same: the module is shared), as `DictEncoder.both`."""
        features = self(obs, compute_dtype)
        return features, features


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [repr(exc)])[0]


class DictEncoder(nn.Module):
    """One encoder per key of a Dict observation (the Nature CNN for images, the MLP for vectors), in the space's
    key order; their float32 outputs are concatenated. Under a compute dtype (bf16) only the CNNs autocast.

    As for single observations, images share their CNN between policy and value, while each vector key has a
    policy MLP and a separate value MLP (`value_features`), so large returns cannot swamp the policy's features.
    `image_encoder` (`--encoder nature|impala|mlp`) builds the image keys' encoders; without `value_mlps` (a
    model with a recurrent core, whose output both heads read) the value features are the policy's.
    """

    def __init__(self, keys: tuple[ObsKey, ...], hidden: int = 64, image_encoder: EncoderFactory = nature_cnn,
                 value_mlps: bool = True, activation: str = "tanh"):
        super().__init__()
        self.image_keys = frozenset(k.key for k in keys if k.image)
        self.encoders = nn.ModuleDict({
            k.key: image_encoder(k.shape, hidden) if k.image else MLP(int(np.prod(k.shape)), hidden, activation)
            for k in keys
        })
        self.value_encoders = nn.ModuleDict({k.key: MLP(int(np.prod(k.shape)), hidden, activation) for k in keys
                                             if not k.image and value_mlps})
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
