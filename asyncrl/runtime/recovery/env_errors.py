"""Env errors of a rollout stage run in the run's own process (`--serial`): counted, printed at most every
`ENV_ERROR_PRINT_EVERY_S`, and judged as a rate (`--max-env-error-rate`) as the forked engine's supervisor does."""

from __future__ import annotations

import time
from collections.abc import Callable

from asyncrl.config import Config
from asyncrl.runtime.recovery.supervisor import CHECK_EVERY_S, ENV_ERROR_PRINT_EVERY_S, EnvErrorRate


class InProcessEnvErrors:
    """`EnvEvents` (asyncrl.runtime.stages.rollout) for a stage in this process: `count`, the newest error."""

    def __init__(self, cfg: Config, out: Callable[..., None]):
        self.cfg, self.out = cfg, out
        self.count = 0
        self.last: dict | None = None
        self.rate = EnvErrorRate(cfg)
        self.printed = -1e9  # time.monotonic() of the last printed line
        self.checked = time.monotonic()

    def env_error(self, message: str, where: str, count: int, split: int, action: str) -> None:
        self.count += count
        self.last = {"message": message, "where": where, "worker": "serial"}
        now = time.monotonic()
        if now - self.printed >= ENV_ERROR_PRINT_EVERY_S:
            self.printed = now
            self.out(f"asyncrl: split {split}: env raised {message} in {where}; {action} ({self.count} env errors; "
                     f"the run stops above --max-env-error-rate {self.cfg.max_env_error_rate:g})", flush=True)

    def counters(self) -> dict[str, int]:
        """The run's restart and error counters, as the forked engine's supervisor keeps them (none restart)."""
        return {"worker_restarts": 0, "policy_restarts": 0, "env_errors": self.count}

    def check(self, env_steps: int, now: float) -> None:
        """RunError once the errors of the last window are above --max-env-error-rate."""
        if now - self.checked >= CHECK_EVERY_S:
            self.checked = now
            self.rate.check(env_steps, self.count, now, self.last)
