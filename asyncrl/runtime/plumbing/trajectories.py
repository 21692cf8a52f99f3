"""The shared trajectory buffer: preallocated slots that rollout workers fill and the learner consumes.

A slot holds one trajectory of one worker split: `rollout` steps of `envs_per_split` envs stepped together.
Rollout workers write observations, rewards, the terminated/truncated flags (plus, for an env whose episode a
time limit cut, the observation it reached: `final_obs`/`final_step`) and step validity; policy workers write
actions, log-probs and the policy version that acted. Queues only ever carry slot indices.

A Dict observation gets one array per key for `obs` and `final_obs` (`obs/<key>`, `final_obs/<key>`);
`obs_arrays(traj, "obs")` gives them back as one `ArrayDict` (a Box observation's plain array otherwise).

With several policies (`--num-policies`), `policy` says which one acts for each env at each step (written by
the rollout worker before it asks for actions) and `versions` holds each row's own policy version.

For recurrent actors (`asyncrl.agents.acting`) the rollout workers write `first` (the env's episode starts at
this step) and the policy workers carry the actor's state in one `state/<name>` array per entry of its
`state_layout`, the state each env acts from at each step. Row T of both, like the bootstrap observation, is
copied into row 0 of the split's next slot. A feed-forward actor has no state columns.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from asyncrl.config import PPO_ONLY, Config
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.dict_obs import ArrayDict
from asyncrl.shm import SharedArrays

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]
NO_FINAL = -1  # final_step of an env with no truncation in the slot
STATE = "state/"  # the prefix of the actor's state arrays


# Slots kept off the free queue at start. A rollout worker killed while handing a slot over (between the free
# queue and its ownership record, or between that record and the full queue) may lose the slot; the supervisor
# then puts a spare in circulation. A spare never duplicates a slot, so at worst one more slot circulates.
SPARE_SLOTS = 2


# Updates a trajectory ages beyond its filling (its wait in the queue, the update in progress) that the cap on
# slots in flight leaves room for (`local_in_flight`).
LAG_MARGIN = 2

REMOTE_IN_FLIGHT = 2  # calls a remote actor group may have out, each holding one slot per split of the group


def circulating_slots(cfg: Config) -> int:
    """The local workers' slots (`local_slots`) and the remote actor groups' (`remote_slots`), ids in that order.

    Bounding the slots is the back-pressure that caps staleness: when the learner falls behind, workers wait
    for a free slot instead of piling up ever older trajectories.
    """
    return local_slots(cfg) + remote_slots(cfg)


def local_slots(cfg: Config) -> int:
    """The slots the local splits may fill at once (`local_in_flight`), plus one batch's worth queued for the
    learner (none without local workers)."""
    return local_in_flight(cfg) + cfg.trajectories_per_batch if cfg.workers else 0


def local_in_flight(cfg: Config) -> int:
    """How many local splits may hold a slot at once: every split, unless that would make APPO's samples older
    than `--max-policy-lag` updates by the time the learner sees them.

    A slot's oldest step is about (slots filled at once) / (trajectories per batch) updates old when it is
    trained on, plus the one it waits in the queue and the update in progress. With many splits and a batch
    of few trajectories (a VectorEnv of thousands of envs per split) that passes the cap, and the learner would
    drop the surplus as stale; the splits without a slot wait instead (back-pressure: a rollout worker never
    blocks while another of its splits holds a slot), and the machine's time goes to the learner.
    """
    splits, per_batch = cfg.num_splits, cfg.trajectories_per_batch
    if cfg.deterministic or cfg.serial or cfg.algo not in PPO_ONLY:  # --serial steps its splits in turn
        return splits
    return min(splits, max((cfg.max_policy_lag - LAG_MARGIN) * per_batch, 1))


def remote_slots(cfg: Config) -> int:
    """The remote groups' own slots (ids after the local ones; the learner frees them to their own queue, so
    neither kind of producer can starve the other): `REMOTE_IN_FLIGHT` calls' worth per group, and without local
    workers at least a batch more than one call per split, so the learner can always fill a batch."""
    if not cfg.remote_workers:
        return 0
    splits = cfg.remote_workers * cfg.remote_splits
    return REMOTE_IN_FLIGHT * splits if cfg.workers else max(REMOTE_IN_FLIGHT * splits,
                                                              splits + cfg.trajectories_per_batch)


def num_slots(cfg: Config) -> int:
    """Slots allocated: the circulating ones (ids 0..) and then the spares."""
    return circulating_slots(cfg) + SPARE_SLOTS


def trajectory_layout(cfg: Config, spec: EnvSpec, state: Layout | None = None, slots: int = 0) -> Layout:
    """The slots' arrays; `state` is the actor's `state_layout` (None or {}: a feed-forward actor); `slots`: how
    many (0: the run's `num_slots`)."""
    s, t, e = slots or num_slots(cfg), cfg.rollout, cfg.envs_per_split
    return {
        **_obs_layout(spec, "obs", (s, t + 1, e)),  # obs[T] is the bootstrap observation
        # The env's episode starts at step t: at the run's (or a split's) first step, after terminated or
        # truncated, after the env instance was replaced following an error. Row T goes with the bootstrap obs.
        "first": ((s, t + 1, e), np.dtype(np.bool_)),
        # The actor's state before step t, per env (row T: after the slot's last step)
        **{f"{STATE}{k}": ((s, t + 1, e, *shape), np.dtype(dtype)) for k, (shape, dtype) in (state or {}).items()},
        "actions": ((s, t, e, *spec.action_shape), spec.action_dtype),
        "logp": ((s, t, e), np.dtype(np.float32)),
        "rewards": ((s, t, e), np.dtype(np.float32)),
        "terminated": ((s, t, e), np.dtype(np.bool_)),  # the episode reached a terminal state after step t
        "truncated": ((s, t, e), np.dtype(np.bool_)),  # a time limit cut the episode after step t
        # The observation an env reached at its first truncation in the slot (before the reset), and that
        # step's index (-1: none). Later truncations of the same env in the slot have no final observation.
        **_obs_layout(spec, "final_obs", (s, e)),
        "final_step": ((s, e), np.dtype(np.int64)),
        "versions": ((s, t), np.dtype(np.int64)),  # policy version that chose each step's actions
        "valid": ((s, t, e), np.dtype(np.bool_)),  # False: the env raised in this step (left out of training)
        # --num-policies N > 1: which policy acts for each env at each step (the rollout worker writes it), and
        # each row's own policy version (it replaces the per-step one)
        **({"policy": ((s, t, e), np.dtype(np.int8)), "versions": ((s, t, e), np.dtype(np.int64))}
           if cfg.acting_policies > 1 else {}),
    }


def _obs_layout(spec: EnvSpec, name: str, lead: tuple[int, ...]) -> Layout:
    if spec.is_dict:
        return {f"{name}/{k.key}": ((*lead, *k.shape), k.dtype) for k in spec.obs_keys}
    return {name: ((*lead, *spec.obs_shape), spec.obs_dtype)}


def obs_arrays(traj: Mapping[str, np.ndarray], name: str = "obs") -> np.ndarray | ArrayDict:
    """The `obs` (or `final_obs`) array, or for a Dict observation its per-key arrays as one ArrayDict."""
    if name in traj:
        return traj[name]
    prefix = name + "/"
    return ArrayDict({k[len(prefix):]: a for k, a in traj.items() if k.startswith(prefix)})


def state_arrays(traj: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The actor's state arrays by entry name ({} for a feed-forward actor)."""
    return {k[len(STATE):]: a for k, a in traj.items() if k.startswith(STATE)}


def allocate_trajectories(cfg: Config, spec: EnvSpec, state: Layout | None = None, slots: int = 0) -> SharedArrays:
    traj = SharedArrays(trajectory_layout(cfg, spec, state, slots))
    traj["final_step"][:] = NO_FINAL
    return traj


def trajectory_bytes(cfg: Config, spec: EnvSpec, state: Layout | None = None) -> int:
    return SharedArrays.estimate_bytes(trajectory_layout(cfg, spec, state))
