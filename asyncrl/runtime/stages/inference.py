"""The inference stage: requested rows of the trajectory slots acted on in one forward pass, knowing nothing of
processes.

A request is a (slot, step) pair: the stage gathers the observations at those rows (an actor with state also
gathers each env's state and episode start there), acts through the acting contract (`asyncrl.agents.acting`),
and writes the actions, their log-probabilities and the acting policy's version into the same rows and the
state after the step into the next row. With several policies (`--num-policies`) each row is acted on by the
policy the slot's `policy` column names, at that policy's own version.
"""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.agents.acting import Actor, State
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.obs import Obs, map_obs
from asyncrl.runtime.plumbing.trajectories import obs_arrays, state_arrays
from asyncrl.shm import SharedArrays


def check_state_layout(actor: Actor, state: dict[str, np.ndarray]) -> None:
    """The slots were sized from the settings alone (`asyncrl.models.registry`): refuse an actor whose state
    differs from them in names, shapes or dtypes."""
    layout = actor.state_layout()
    if set(layout) != set(state) or any(state[k].shape[3:] != tuple(shape) or state[k].dtype != np.dtype(dtype)
                                        for k, (shape, dtype) in layout.items()):
        raise RuntimeError(f"the trajectory slots hold the state {({k: a.shape[3:] for k, a in state.items()})}, "
                           f"the actor's is {({k: shape for k, (shape, _) in layout.items()})}")


class InferenceStage:
    """Acts on requested rows with `actors` (one per policy) on `device`."""

    def __init__(self, cfg: Config, spec: EnvSpec, traj: SharedArrays, actors: list[Actor], device: torch.device):
        self.cfg, self.spec, self.actors, self.device = cfg, spec, actors, device
        self.obs, self.first, self.state = obs_arrays(traj, "obs"), traj["first"], state_arrays(traj)
        self.actions, self.logp, self.versions = traj["actions"], traj["logp"], traj["versions"]
        self.policy_of = traj["policy"] if len(actors) > 1 else None
        check_state_layout(actors[0], self.state)

    def serve(self, slots: np.ndarray, steps: np.ndarray, versions: list[int]) -> int:
        """Act on rows (slots[i], steps[i]) with each policy at `versions[p]`; the samples acted on."""
        n, envs, device = len(slots), self.cfg.envs_per_split, self.device
        if self.spec.is_dict:  # one gathered copy per key
            obs: Obs = {k: torch.from_numpy(a[slots, steps]).flatten(0, 1).to(device, non_blocking=True)
                        for k, a in self.obs.items()}
        else:
            batch = torch.from_numpy(self.obs[slots, steps])  # [n, envs per split, ...] gathered copy
            obs = batch.reshape(-1, *self.spec.obs_shape).to(device, non_blocking=True)
        starts, before = None, {}
        if self.state:  # an actor with state: each env's state and episode start at this step, its state after it
            starts = torch.from_numpy(self.first[slots, steps]).flatten().to(device, non_blocking=True)
            before = {k: torch.from_numpy(a[slots, steps]).flatten(0, 1).to(device, non_blocking=True)
                      for k, a in self.state.items()}
        if self.policy_of is None:
            acts, lps, after = self.actors[0].act(obs, before, starts)
            self.versions[slots, steps] = versions[0]
        else:
            rows = self.policy_of[slots, steps].reshape(-1)
            acts, lps, after = act_by_policy(self.actors, rows, obs, before, starts)
            self.versions[slots, steps] = np.asarray(versions)[rows].reshape(n, -1)
        for k, a in self.state.items():
            a[slots, steps + 1] = after[k].cpu().numpy().reshape(n, envs, *a.shape[3:])
        self.actions[slots, steps] = acts.cpu().numpy().reshape(n, envs, *self.spec.action_shape)
        self.logp[slots, steps] = lps.cpu().numpy().reshape(n, envs)
        return n * envs


def act_by_policy(actors: list[Actor], rows: np.ndarray, obs: Obs, state: State, first: torch.Tensor | None,
                  ) -> tuple[torch.Tensor, torch.Tensor, State]:
    """Each row acted on by the policy `rows` names (one forward pass per policy present), in the rows' order."""
    out_actions: torch.Tensor | None = None
    out_logp: torch.Tensor | None = None
    out_state: State = {}
    for p in np.unique(rows).tolist():
        idx = torch.from_numpy(np.flatnonzero(rows == p))
        acts, lps, after = actors[p].act(map_obs(obs, lambda x, idx=idx: x[idx.to(x.device)]),
                                         {k: v[idx.to(v.device)] for k, v in state.items()},
                                         None if first is None else first[idx.to(first.device)])
        if out_actions is None:
            out_actions = acts.new_empty((len(rows), *acts.shape[1:]))
            out_logp = lps.new_empty(len(rows))
            out_state = {k: v.new_empty((len(rows), *v.shape[1:])) for k, v in after.items()}
        out_actions[idx.to(acts.device)] = acts
        out_logp[idx.to(lps.device)] = lps
        for k, v in after.items():
            out_state[k][idx.to(v.device)] = v
    assert out_actions is not None and out_logp is not None
    return out_actions, out_logp, out_state
