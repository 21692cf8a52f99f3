"""Counters a process accumulates and sends to the runner about once a second, even while it is blocked."""

from __future__ import annotations

import time
from typing import Any

from asyncrl.runtime.channels import Channels, report


class IntervalStats:
    def __init__(self, channels: Channels, kind: str, ident: int, every_s: float = 1.0):
        self.channels, self.kind, self.ident, self.every_s = channels, kind, ident, every_s
        self.last = time.monotonic()
        self.sums: dict[str, float] = {}
        self.lists: dict[str, list] = {}
        live = getattr(channels, "live", None)  # heartbeat: every call below marks this process as making progress
        self.beat = live[f"beat_{kind}"] if live is not None and f"beat_{kind}" in live else [0.0] * (ident + 1)

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0) + value

    def extend(self, key: str, items: list) -> None:
        self.lists.setdefault(key, []).extend(items)

    def maybe_report(self, force: bool = False, **extra: Any) -> None:
        """Send the interval's sums (plus `t_total`, the interval's length) if a second has passed (or `force`)."""
        now = time.monotonic()
        self.beat[self.ident] = now
        if now - self.last < self.every_s and not force:
            return
        report(self.channels, self.kind, self.ident, {**self.sums, **self.lists, **extra, "t_total": now - self.last})
        self.sums = {k: 0 for k in self.sums}
        self.lists = {k: [] for k in self.lists}
        self.last = now
