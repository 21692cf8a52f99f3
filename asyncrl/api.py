"""The Python API: `asyncrl.train(...)` runs a training exactly as `asyncrl-train` does.

    result = asyncrl.train(env="CartPole-v1", frames=150_000)      # keyword flags, as on the command line
    result = asyncrl.train(Config(env="CartPole-v1", frames=150_000))
    result = asyncrl.train(config="cartpole.yaml", seed=1)         # a config file; keyword flags win over it

Settings resolve as the command line's do (flags > config file > the env family's preset > defaults; with
resume=True the run's saved config.json stands in for preset and defaults), are validated the same way, and
the run writes the same directory. The engine forks its workers from the calling process: see
`asyncrl.launch.check_can_fork` for where that is refused (`serial=True` runs everything in it and forks nothing:
`asyncrl.runtime.serial`). Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asyncrl.config import Config, ConfigError
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.launch import run
from asyncrl.resolve import resolve_flags
from asyncrl.runtime.plumbing.callbacks import Callbacks


class TrainingFailed(RuntimeError):
    """The run started but ended with an error (the messages above say which); its checkpoints are kept."""

    def __init__(self, message: str, result: TrainResult):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class TrainResult:
    """What a finished run left: its directory, its last metrics.jsonl record and how it ended."""

    run_dir: str
    metrics: dict[str, Any]  # the last metrics.jsonl record ({} if the run wrote none)
    exit_code: int
    stop_reason: str | None  # "frames", "seconds", "callback", "SIGINT", "SIGTERM" or "SIGHUP"
    config: Config


def train(cfg: Config | None = None, /, *, config: str | None = None,
          callbacks: Iterable[Callable[[dict[str, Any]], Any]] = (), **flags: Any) -> TrainResult:
    """Train as `asyncrl-train` would and return the run's result.

    `cfg` (a Config) gives settings the way command-line flags do: its fields that differ from Config's
    defaults count as given, the others take the preset's values. `config` is a YAML or JSON file of
    settings, `flags` are Config field names (e.g. `batch_size=512`); flags win over `cfg`, both over the file.
    `callbacks` are called here with every metrics record and every checkpoint and evaluation event (a dict with
    `event` set to "metrics", "checkpoint" or "eval"); one that returns False stops the run cleanly, with a final
    checkpoint (`stop_reason` "callback"); one that raises stops it with an error naming it.

    Raises ConfigError (a ValueError) for bad settings, EnvError for an unusable env, ForkError (a
    RuntimeError) where this process cannot fork the workers (never with `serial=True`), and TrainingFailed if
    the run ends with an error.
    Ctrl-C (SIGINT) stops the run cleanly and returns its result, like the command line's exit code 0.
    """
    if cfg is not None and not isinstance(cfg, Config):
        raise ConfigError(f"asyncrl.train() takes a Config or keyword flags, not a {type(cfg).__name__}")
    hooks = Callbacks(callbacks)  # TypeError for a non-callable, before anything is resolved or written
    given = _given_fields(cfg) if cfg is not None else {}
    resolved = resolve_flags(config, **{**given, **flags})  # with the env spec it made, for the preflight
    code, stop_reason, ran = run(resolved, callbacks=hooks.fns)  # under torchrun, `ran` is this rank's settings
    records = read_metrics(ran.run_dir)
    result = TrainResult(ran.run_dir, records[-1] if records else {}, code, stop_reason, ran)
    if code != 0:
        raise TrainingFailed(f"training in {ran.run_dir} failed (exit code {code}); see the error above", result)
    return result


def _given_fields(cfg: Config) -> dict[str, Any]:
    """The fields of `cfg` that differ from the defaults: what the command line would have been given."""
    defaults = dataclasses.asdict(Config())
    return {k: v for k, v in dataclasses.asdict(cfg).items() if v != defaults[k]}
