"""Observations as tensors: one tensor (a Box observation) or a dict of tensors, one per key (a Dict one)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from asyncrl.envs.dict_obs import ArrayDict

Obs = torch.Tensor | dict[str, torch.Tensor]


def map_obs(obs: Obs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Obs:
    """`fn` applied to a tensor, or to each key's tensor of a dict."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


def obs_tensors(obs: Obs) -> list[torch.Tensor]:
    return list(obs.values()) if isinstance(obs, dict) else [obs]


def obs_from_numpy(obs: np.ndarray | ArrayDict, device: torch.device | str | None = None) -> Obs:
    """A numpy observation batch (or an ArrayDict of them) as tensors on `device` (sharing memory on the CPU)."""
    if isinstance(obs, ArrayDict):
        return {k: torch.from_numpy(a).to(device) for k, a in obs.items()}
    return torch.from_numpy(obs).to(device)
