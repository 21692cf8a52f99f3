"""asyncrl: an asynchronous shared-memory reinforcement-learning trainer.

    import asyncrl
    result = asyncrl.train(env="CartPole-v1", frames=150_000)   # as `asyncrl-train --env CartPole-v1 ...`
    policy = asyncrl.load_policy(result.run_dir)                # raw observations -> actions (a torch module)

Importing asyncrl does not import torch: the names below load their modules on first use (the training
process forks its workers and must not have run torch operations; see docs/python-api.md).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from asyncrl.version import __version__

# OpenMP threads that wait at a barrier sleep instead of spinning, unless the user chose: read once, when torch
# loads OpenMP, so it is set before any torch import. A learner with 2 threads beside the workers on 2 busy cores
# trained 14.5k agent steps/s spinning and 157k sleeping (docs/performance.md, "Compiled steps").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_LAZY = {
    "train": "asyncrl.api", "TrainResult": "asyncrl.api", "TrainingFailed": "asyncrl.api",
    "Config": "asyncrl.config", "ConfigError": "asyncrl.config",
    "ForkError": "asyncrl.launch",
    "load_policy": "asyncrl.policy", "Policy": "asyncrl.policy", "PolicyLoadError": "asyncrl.policy",
}

__all__ = ["Config", "ConfigError", "ForkError", "Policy", "PolicyLoadError", "TrainResult", "TrainingFailed",
           "__version__", "load_policy", "train"]

if TYPE_CHECKING:
    from asyncrl.api import TrainingFailed, TrainResult, train
    from asyncrl.config import Config, ConfigError
    from asyncrl.launch import ForkError
    from asyncrl.policy import Policy, PolicyLoadError, load_policy


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
