"""`--algo` -> learner class. Adding a learner: one module in this package and one line in `LEARNERS`.

Entries name their class as "module:Class" so that this file, which the torch-free runner imports to check
`--algo`, loads torch only when a learner is built (a class object works too).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec

if TYPE_CHECKING:
    import torch

    from asyncrl.agents.base import Learner, PublishedPolicy

LEARNERS: dict[str, Any] = {
    "appo": "asyncrl.agents.appo.learner:APPOLearner",
    "sac": "asyncrl.agents.off_policy.sac:SACLearner",
    "td3": "asyncrl.agents.off_policy.td3:TD3Learner",
    "redq": "asyncrl.agents.off_policy.redq:REDQLearner",
}
OFF_POLICY = frozenset({"sac", "td3", "redq"})  # replay learners: Box actions, vector observations


def check_algo(name: str) -> None:
    """ConfigError (one line, the choices) unless `name` is a registered learner."""
    if name not in LEARNERS:
        raise ConfigError(f"--algo must be one of {', '.join(sorted(LEARNERS))} (got {name!r})")


def check_algo_env(cfg: Config, spec: EnvSpec) -> None:
    """ConfigError (one line) when `cfg.algo` cannot train on this env, or its replay buffer would not fit in RAM."""
    if cfg.algo not in OFF_POLICY:
        return
    import numpy as np

    if spec.num_agents > 1:
        raise ConfigError(f"--algo {cfg.algo} trains single-agent envs, but {cfg.env} has {spec.num_agents} agents; "
                          f"use --algo appo")

    from asyncrl.replay.buffer import check_fits, memory_bytes

    if spec.is_dict:
        raise ConfigError(f"--algo {cfg.algo} takes vector observations, but {cfg.env} has a Dict observation space; "
                          f"use --algo appo")
    space = spec.action_space
    if spec.discrete or spec.multi_discrete or not hasattr(space, "low"):
        raise ConfigError(f"--algo {cfg.algo} needs continuous (Box) actions, but {cfg.env} has {space}; "
                          f"use --algo appo")
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        raise ConfigError(f"--algo {cfg.algo} needs finite action bounds, but {cfg.env} has {space}; use --algo appo")
    if len(spec.obs_shape) != 1:
        raise ConfigError(f"--algo {cfg.algo} takes vector observations, but {cfg.env}'s have shape "
                          f"{tuple(spec.obs_shape)}; use --algo appo")
    check_fits(memory_bytes(cfg.replay_size, spec.obs_shape, spec.obs_dtype, spec.action_shape, np.float32,
                            segment_len=cfg.rollout))


def learner_class(name: str) -> type[Learner]:
    check_algo(name)
    entry = LEARNERS[name]
    if isinstance(entry, str):
        module, _, cls = entry.partition(":")
        entry = getattr(importlib.import_module(module), cls)
    return entry


def published_policy(name: str) -> type[PublishedPolicy]:
    """How a run of `--algo name` publishes and checkpoints its policy (a ConfigError for an unknown name)."""
    return learner_class(name)  # type: ignore[return-value]


def make_learner(cfg: Config, spec: EnvSpec, device: torch.device) -> Learner:
    """The learner `cfg.algo` names, built for this env on `device`."""
    return learner_class(cfg.algo)(cfg, spec, device)
