"""Counters a process accumulates and sends to the runner about once a second (or each --report-interval, where
that is shorter), even while it is blocked."""

from __future__ import annotations

import time
from typing import Any

from asyncrl.runtime.plumbing.channels import Channels, report
from asyncrl.runtime.plumbing.schedstat import run_queue_delay_s

EVERY_S = 1.0  # seconds between reports, at most


class IntervalStats:
    def __init__(self, channels: Channels, kind: str, ident: int, report_interval: float = EVERY_S):
        """Reports every `EVERY_S`, or every `report_interval` (the run's --report-interval) where that is shorter,
        so that records written more often than once a second get fresh counts."""
        self.channels, self.kind, self.ident = channels, kind, ident
        self.every_s = min(EVERY_S, report_interval)
        self.last = time.monotonic()
        self.sums: dict[str, float] = {}
        self.lists: dict[str, list] = {}
        live = getattr(channels, "live", None)  # heartbeat: every call below marks this process as making progress
        self.beat = live[f"beat_{kind}"] if live is not None and f"beat_{kind}" in live else [0.0] * (ident + 1)
        self.runq = run_queue_delay_s()  # None where the kernel keeps no schedstat

    def restart(self) -> None:
        """Start the interval now, dropping what was summed: start-up waits are not steady-state stage time."""
        self.last = time.monotonic()
        self.runq = run_queue_delay_s() if self.runq is not None else None
        self.sums = {k: 0 for k in self.sums}
        self.lists = {k: [] for k in self.lists}

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0) + value

    def extend(self, key: str, items: list) -> None:
        self.lists.setdefault(key, []).extend(items)

    def maybe_report(self, force: bool = False, **extra: Any) -> None:
        """Send the interval's sums (plus `t_total`, the interval's length, and `t_runq`, the part of it spent
        runnable but waiting for a core) once `every_s` has passed (or `force`)."""
        now = time.monotonic()
        self.beat[self.ident] = now
        if now - self.last < self.every_s and not force:
            return
        runq = run_queue_delay_s() if self.runq is not None else None
        waited = {} if runq is None else {"t_runq": runq - self.runq}
        self.runq = runq
        report(self.channels, self.kind, self.ident,
               {**self.sums, **self.lists, **extra, **waited, "t_total": now - self.last})
        self.sums = {k: 0 for k in self.sums}
        self.lists = {k: [] for k in self.lists}
        self.last = now
