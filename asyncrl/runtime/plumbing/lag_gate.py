"""Hold the learner's next update while it would make a trajectory not yet trained on staler than the lag cap.

The cap on slots in flight (`trajectories.local_in_flight`) bounds how many slots fill at once, not how long one
takes: when a rollout worker is starved of a core, the other workers' slots go round several times while its one
slot fills, and each of their batches moves the policy on, so that slot's first steps would arrive older than
`--max-policy-lag` updates and be dropped. A local slot is *begun* from its first acted step until the learner
takes it for an update (`acted[slot] >= 0`: the policy worker sets it, the learner clears it when it copies the
slot out); its first step's version is `traj["versions"][slot, 0]`. Before each update the learner trains the
oldest slots it holds first (`oldest_first`) and waits while the update would move the policy past the cap of a
begun slot left out of it (`ready`). The other workers wait too (their slots are not freed), so the starved one
gets the cores and hands its slot over. A wait longer than `MAX_WAIT_S` (a worker hung or dying, which the
supervisor handles) lets the update go on: its stale samples are then dropped and counted as before.
"""

from __future__ import annotations

import time

import numpy as np

from asyncrl.config import PPO_ONLY, Config
from asyncrl.runtime.plumbing.liveness import NO_OWNER
from asyncrl.runtime.plumbing.trajectories import local_slots
from asyncrl.shm import SharedArrays

MAX_WAIT_S = 5.0


class LagGate:
    """Which slots an update trains first, and whether it may go now (see the module docstring)."""

    def __init__(self, cfg: Config, traj: SharedArrays, live: SharedArrays) -> None:
        self.slots = local_slots(cfg)
        # APPO with one policy and local workers; not in lockstep (--deterministic hands slots back after each
        # update), nor with several policies (each row its own version), nor at --max-policy-lag 0 (every slot in
        # flight is stale at the next update: those runs drop, as asked)
        self.active = (cfg.algo in PPO_ONLY and cfg.workers > 0 and cfg.num_policies == 1 and not cfg.deterministic
                       and cfg.max_policy_lag >= 1 and traj["versions"].ndim == 2)
        self.max_lag = cfg.max_policy_lag
        self.acted = live["acted"][:self.slots]
        self.first_version = traj["versions"][:self.slots, 0]
        self.waiting_since: float | None = None

    def oldest_first(self, slots: list[int]) -> list[int]:
        """`slots` (full ones the learner holds), the oldest first step first."""
        return sorted(slots, key=lambda s: int(self.first_version[s]) if s < self.slots else np.iinfo(np.int64).max)

    def ready(self, version: int, batch: list[int]) -> bool:
        """Whether an update at `version` on `batch` leaves every other begun slot within the cap."""
        begun = self.acted >= 0
        begun[[s for s in batch if s < self.slots]] = False
        now = time.monotonic()
        if not begun.any() or version + 1 - int(self.first_version[begun].min()) <= self.max_lag:
            self.waiting_since = None
            return True
        if self.waiting_since is None:
            self.waiting_since = now
        if now - self.waiting_since >= MAX_WAIT_S:
            self.waiting_since = None
            return True
        return False

    def taken(self, batch: list[int]) -> None:
        """The learner copied `batch` out: those slots are no longer begun."""
        self.acted[[s for s in batch if s < self.slots]] = NO_OWNER
