"""A rollout worker's fault handling in the forked engine, kept out of its hot loop.

The rollout stage (`asyncrl.runtime.stages.rollout`) triages env faults; this guard is how a forked worker reports
them and keeps its liveness:

- Env errors go to the runner as "env_error" reports and into the shared `env_errors` count; they are judged as a
  rate by the runner (`--max-env-error-rate`), not counted against the worker.
- What the stage cannot recover from (`StageFatal`: envs that cannot be created, fresh instances that fail
  before their first step) stops the run at once with a fatal report: restarting the worker would only fail again.
- While the worker waits for actions it still beats its heartbeat, and when a policy worker has been
  restarted (`policy_epoch` changed) it re-sends the requests that were not answered: the dead policy worker
  may have taken them off the queue. The `want`/`acted` handshake (see `asyncrl.runtime.plumbing.liveness`) makes
  the duplicates harmless.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import NoReturn

from asyncrl.config import Config
from asyncrl.envs.base import VecEnv
from asyncrl.runtime.plumbing.channels import Channels, Full, report
from asyncrl.runtime.plumbing.liveness import NO_OWNER
from asyncrl.runtime.stages.rollout import RolloutStage, StageFatal
from asyncrl.shm import SharedArrays

EXIT_ENV_ERRORS = 3  # exit code of a rollout worker whose envs broke and that could not even report it
FATAL_PUT_TIMEOUT_S = 10.0


class RolloutGuard:
    """Worker `worker`'s rollout stage (`stage`, its --worker-splits splits) and its side of the liveness records."""

    def __init__(self, worker: int, cfg: Config, channels: Channels, traj: SharedArrays):
        self.worker, self.cfg, self.channels = worker, cfg, channels
        live = channels.live
        self.beat, self.owner = live["beat_rollout"], live["slot_owner"]
        self.want, self.acted = live["want"], live["acted"]
        self.env_errors, self.policy_epoch = live["env_errors"], live["policy_epoch"]
        self.epoch = int(self.policy_epoch[0])
        self.stage = RolloutStage(cfg, traj, cfg.worker_splits, worker * cfg.worker_splits, self,
                                  generation=int(live["incarnation"][worker]))

    def make_envs(self) -> list[VecEnv]:
        try:
            return self.stage.make_envs()
        except StageFatal as exc:
            self.fatal(str(exc), exc.exit_code)

    def before_request(self, split: int, slot: int, t: int) -> None:  # noqa: B027 - the worker sets its own
        """What the worker writes into step t's row before asking for its actions (which policy acts where)."""

    def begin(self, split: int, slot: int) -> None:
        """Hold `slot` for `split`, reset the split's envs into its first step and ask for actions."""
        self.owner[slot] = self.worker
        try:
            self.stage.begin(split, slot)
        except StageFatal as exc:
            self.fatal(str(exc), exc.exit_code)
        self.acted[slot] = NO_OWNER
        self.request(split, slot, 0)

    def request(self, split: int, slot: int, t: int) -> None:
        """Ask for the actions of step t of the split's slot."""
        self.want[slot] = t
        self.before_request(split, slot, t)
        self.channels.requests.put((self.worker, split, slot, t))

    def env_error(self, message: str, where: str, count: int, split: int, action: str) -> None:
        """The stage's env errors: counted for the runner's error rate and reported (`EnvEvents`)."""
        self.env_errors[self.worker] += count
        report(self.channels, "env_error", self.worker,
               {"message": message, "where": where, "count": self.stage.errors, "worker": self.worker,
                "action": action})

    def fatal(self, message: str, exit_code: int = 1) -> NoReturn:
        """Stop the run: report (never dropped), then wait for the runner's stop so it reads the report first.
        `exit_code` is the run's (2: bad input)."""
        try:
            self.channels.reports.put(("fatal", self.worker, time.time(), {"message": f"rollout-{self.worker}: "
                                       f"{message}; stopping.", "code": "env_broken", "exit_code": exit_code}),
                                      timeout=FATAL_PUT_TIMEOUT_S)
        except Full:
            raise SystemExit(EXIT_ENV_ERRORS) from None
        while not self.channels.stopping:
            self.heartbeat()
            time.sleep(0.05)
        raise SystemExit(0)

    def idle(self, skip: Collection[int] = ()) -> None:
        """Called while waiting for actions: heartbeat, and re-send requests a dead policy worker lost (not for
        the splits in `skip`, which hold no slot)."""
        self.beat[self.worker] = time.monotonic()
        self.check_policy_restarts(skip)

    def heartbeat(self) -> None:
        self.beat[self.worker] = time.monotonic()

    def check_policy_restarts(self, skip: Collection[int] = ()) -> None:
        """If a policy worker was restarted since the last look, re-send every unanswered request (not for the
        splits in `skip`, which hold no slot)."""
        if self.policy_epoch[0] == self.epoch:
            return
        self.epoch = int(self.policy_epoch[0])
        for split, slot in enumerate(self.stage.slots):
            if split in skip:
                continue
            t = self.stage.steps[split]
            if self.acted[slot] == t:  # answered; only the wake-up may have been lost
                self.channels.actions_ready[self.worker].put(split)
            else:
                self.channels.requests.put((self.worker, split, slot, t))
