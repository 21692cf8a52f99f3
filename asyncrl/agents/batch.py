"""The training data every learner receives: full trajectory slots copied out of shared memory.

`gather_batch` is the one data movement all learners share; an on-policy learner trains on the `Batch`
directly, an off-policy one copies it into its replay buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from asyncrl.models.obs import Obs, map_obs


class TensorDict(dict[str, torch.Tensor]):
    """Named tensors (a recurrent state), cloned together as one."""

    def clone(self) -> TensorDict:
        return TensorDict({k: v.clone() for k, v in self.items()})


@dataclass
class Batch:
    """Time-major training data: T steps x B envs (B = trajectories x envs per split)."""

    obs: Obs  # [T + 1, B, ...] (a Dict observation: a dict of such tensors, one per key)
    actions: torch.Tensor  # [T, B, ...]
    behaviour_logp: torch.Tensor  # [T, B]
    rewards: torch.Tensor  # [T, B]
    terminated: torch.Tensor  # [T, B] bool: the episode reached a terminal state after step t
    truncated: torch.Tensor  # [T, B] bool: a time limit cut the episode after step t
    final_obs: Obs  # [B, ...] the observation an env reached at its bootstrapped truncation
    final_step: torch.Tensor  # [B] that truncation's step, -1 when the env has none
    lag: torch.Tensor  # [T, B] learner version - behaviour version
    valid: torch.Tensor | None = None  # [T, B] bool; False where the env raised (None: all valid)
    # [T + 1, B] bool: the env's episode starts at step t (the recurrent state restarts there); when not given,
    # the steps after an episode end (and none at step 0)
    first: torch.Tensor | None = None
    # {name: [B, ...]}: the actor's state before step 0 (`asyncrl.agents.acting`; {} for feed-forward actors)
    initial_state: TensorDict = field(default_factory=TensorDict)
    policy: torch.Tensor | None = None  # [T, B] int8: the policy that acted (--num-policies > 1); None: one policy

    def __post_init__(self) -> None:
        if self.first is None:
            ended = self.terminated.bool() | self.truncated.bool()
            self.first = torch.cat([torch.zeros_like(ended[:1]), ended])
        if not isinstance(self.initial_state, TensorDict):
            self.initial_state = TensorDict(self.initial_state)

    def policy_rows(self, policy: int, version: int) -> Batch | None:
        """The env columns in which `policy` acted, with only its own rows valid and the lag counted from
        `version` (a batch of several policies is gathered at version 0); None where it did not act."""
        assert self.policy is not None
        mine = self.policy == policy
        cols = torch.nonzero(mine.any(0)).squeeze(1)
        if not len(cols):
            return None
        sub = self.columns(cols)
        own = mine[:, cols]
        sub.valid = own if sub.valid is None else sub.valid & own
        sub.lag = sub.lag + version
        sub.policy = None
        return sub

    def columns(self, cols: slice | torch.Tensor) -> Batch:
        def take(f: str, x: torch.Tensor) -> torch.Tensor:
            return x[cols] if f in PER_ENV else x[:, cols]

        return Batch(**{f: None if (x := getattr(self, f)) is None else map_obs(x, lambda v, f=f: take(f, v))
                        for f in self.__dataclass_fields__})

    def trainable(self, max_policy_lag: int) -> torch.Tensor:
        """The loss mask: fresh enough and not a step in which the env raised."""
        mask = (self.lag <= max_policy_lag).float()
        return mask if self.valid is None else mask * self.valid

    def cut_without_terminal(self) -> torch.Tensor:
        """[T, B] bool: episode ends with a value after them: time-limit cuts, and steps in which the env raised
        (their transition is lost: `asyncrl.algo.time_limits` treats them as cuts without a final observation)."""
        return self.truncated if self.valid is None else self.truncated | ~self.valid

    def has_final(self) -> torch.Tensor:
        """[T, B] bool: truncated steps whose final observation is in `final_obs`."""
        steps = torch.arange(self.rewards.shape[0], device=self.final_step.device).unsqueeze(1)
        return self.truncated & (steps == self.final_step.unsqueeze(0))


STATE = "state/"  # the slots' state arrays (`asyncrl.runtime.plumbing.trajectories.STATE`)
PER_ENV = frozenset({"final_obs", "final_step", "initial_state"})  # Batch fields indexed by env only (no time)


def gather_batch(traj: Mapping[str, np.ndarray], slots: np.ndarray, version: int, device: torch.device) -> Batch:
    """Copy the given slots out of the shared buffer into time-major tensors on `device`."""

    def time_major(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        x = torch.from_numpy(traj[name][slots])  # [k, T(+1), E, ...] (fancy indexing copies)
        x = x.transpose(0, 1).reshape(x.shape[1], -1, *x.shape[3:])
        x = x.pin_memory() if device.type == "cuda" else x
        return x.to(device, dtype=dtype, non_blocking=True)

    def env_major(name: str) -> torch.Tensor:
        x = torch.from_numpy(traj[name][slots])  # [k, E, ...]
        return x.reshape(-1, *x.shape[2:]).to(device)

    def observations(name: str, copy) -> Obs:
        if name in traj:
            return copy(name)
        keys = [k for k in traj if k.startswith(name + "/")]  # a Dict observation: one array per key
        return {k[len(name) + 1:]: copy(k) for k in keys}

    def initial(name: str) -> torch.Tensor:
        x = torch.from_numpy(traj[name][slots, 0])  # [k, E, ...]: the state before each slot's first step
        return x.reshape(-1, *x.shape[2:]).to(device)

    e = traj["valid"].shape[2]
    if traj["versions"].ndim == 3:  # several policies: each row's own version
        versions = time_major("versions").cpu()
    else:
        versions = torch.from_numpy(traj["versions"][slots]).t().repeat_interleave(e, dim=1)  # [T, k*E]
    return Batch(
        obs=observations("obs", time_major),
        actions=time_major("actions"),
        behaviour_logp=time_major("logp"),
        rewards=time_major("rewards"),
        terminated=time_major("terminated"),
        truncated=time_major("truncated"),
        final_obs=observations("final_obs", env_major),
        final_step=env_major("final_step"),
        lag=(version - versions).to(device),
        valid=time_major("valid"),
        first=time_major("first"),
        initial_state=TensorDict({k[len(STATE):]: initial(k) for k in traj if k.startswith(STATE)}),
        policy=time_major("policy") if "policy" in traj else None,
    )
