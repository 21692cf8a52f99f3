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

    from asyncrl.learners.base import Learner

LEARNERS: dict[str, Any] = {
    "appo": "asyncrl.learners.appo:APPOLearner",
}


def check_algo(name: str) -> None:
    """ConfigError (one line, the choices) unless `name` is a registered learner."""
    if name not in LEARNERS:
        raise ConfigError(f"--algo must be one of {', '.join(sorted(LEARNERS))} (got {name!r})")


def learner_class(name: str) -> type[Learner]:
    check_algo(name)
    entry = LEARNERS[name]
    if isinstance(entry, str):
        module, _, cls = entry.partition(":")
        entry = getattr(importlib.import_module(module), cls)
    return entry


def make_learner(cfg: Config, spec: EnvSpec, device: torch.device) -> Learner:
    """The learner `cfg.algo` names, built for this env on `device`."""
    return learner_class(cfg.algo)(cfg, spec, device)
