"""The shared trajectory buffer: preallocated slots that rollout workers fill and the learner consumes.

A slot holds one trajectory of one worker split: `rollout` steps of `envs_per_split` envs stepped together.
Rollout workers write observations, rewards, dones and step validity; policy workers write actions, log-probs and the
policy version that acted. Queues only ever carry slot indices.
"""

from __future__ import annotations

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.shared import SharedArrays

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


def num_slots(cfg: Config) -> int:
    """One slot in flight per split, plus one batch's worth queued for the learner.

    Bounding the slots is the back-pressure that caps staleness: when the learner falls behind, workers wait
    for a free slot instead of piling up ever older trajectories.
    """
    return cfg.num_splits + cfg.trajectories_per_batch


def trajectory_layout(cfg: Config, spec: EnvSpec) -> Layout:
    s, t, e = num_slots(cfg), cfg.rollout, cfg.envs_per_split
    return {
        "obs": ((s, t + 1, e, *spec.obs_shape), spec.obs_dtype),  # obs[T] is the bootstrap observation
        "actions": ((s, t, e, *spec.action_shape), spec.action_dtype),
        "logp": ((s, t, e), np.dtype(np.float32)),
        "rewards": ((s, t, e), np.dtype(np.float32)),
        "dones": ((s, t, e), np.dtype(np.bool_)),
        "versions": ((s, t), np.dtype(np.int64)),  # policy version that chose each step's actions
        "valid": ((s, t, e), np.dtype(np.bool_)),  # False: the env raised in this step (left out of training)
    }


def allocate_trajectories(cfg: Config, spec: EnvSpec) -> SharedArrays:
    return SharedArrays(trajectory_layout(cfg, spec))


def trajectory_bytes(cfg: Config, spec: EnvSpec) -> int:
    return SharedArrays.estimate_bytes(trajectory_layout(cfg, spec))
