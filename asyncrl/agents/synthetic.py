"""A zero batch of a run's shapes, for compiling an update before the first real batch (`--compile`)."""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.agents.batch import Batch
from asyncrl.envs.base import MASK_KEY, EnvSpec
from asyncrl.models.obs import Obs


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def zero_obs(spec: EnvSpec, lead: tuple[int, ...], device: torch.device) -> Obs:
    """Observations of zeros, [*lead, ...] (an action mask all ones: every action allowed)."""
    if spec.is_dict:
        return {k.key: (torch.ones if k.key == MASK_KEY else torch.zeros)((*lead, *k.shape),
                                                                          dtype=_torch_dtype(k.dtype), device=device)
                for k in spec.obs_keys}
    return torch.zeros((*lead, *spec.obs_shape), dtype=_torch_dtype(spec.obs_dtype), device=device)


def synthetic_batch(spec: EnvSpec, t: int, b: int, device: torch.device,
                    state_layout: dict | None = None) -> Batch:
    """T steps x B envs of zeros, fresh (lag 0), no episode ends; `state_layout` gives the initial state's arrays."""
    zeros = torch.zeros((t, b), device=device)
    never = torch.zeros((t, b), dtype=torch.bool, device=device)
    state = {k: torch.zeros((b, *shape), dtype=_torch_dtype(dtype), device=device)
             for k, (shape, dtype) in (state_layout or {}).items()}
    return Batch(obs=zero_obs(spec, (t + 1, b), device),
                 actions=torch.zeros((t, b, *spec.action_shape), dtype=_torch_dtype(spec.action_dtype), device=device),
                 behaviour_logp=zeros, rewards=zeros.clone(), terminated=never, truncated=never.clone(),
                 final_obs=zero_obs(spec, (b,), device), final_step=torch.full((b,), -1, device=device),
                 lag=torch.zeros((t, b), dtype=torch.long, device=device), initial_state=state)

