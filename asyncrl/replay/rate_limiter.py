"""Updates-to-data (UTD) control: keep gradient updates per env step at a ratio R within a tolerance band.

Modelled on Reverb's `SampleToInsertRatio` rate limiter (Cassirer et al. 2021, "Reverb: A Framework for
Experience Replay", section 3.3). With `inserts` env steps (transitions) inserted and `updates` gradient
updates sampled,

    diff = inserts * R - updates,    offset = R * min_steps,    kept within [offset - tolerance, offset + tolerance]

Inserting is allowed while the buffer is still warming up (`inserts + n <= min_steps`) or while the new
diff stays <= the upper bound; an update is allowed once `min_steps` are in and while the new diff stays
>= the lower bound. The offset means the learner does not "catch up" on the warm-up steps: after
`min_steps`, it does R updates per further step. A slow learner therefore blocks the inserter, and slow
inserts block the learner, each within the band.

Lock-free across processes: the two counters live in an anonymous shared mapping (each on its own cache
line), and each has a single writer: the inserting process increments `inserts` after it has written the
data, the learner increments `updates` after it has sampled. Each side reads the other's counter without a
lock. A stale read can only show the other counter lower than it is, which makes the reader's own check
more conservative (the inserter sees a larger diff, the learner a smaller one), so the band holds without
locks. Aligned 8-byte loads and stores are atomic on x86-64 and AArch64; the data-then-counter order is
visible in that order on x86-64 (TSO), while weaker memory models would want a fence before the increment.

No deadlock needs `2 * tolerance >= max(R * steps per insert, updates per sample)`; the constructor checks
it for the given chunk sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from asyncrl.runtime.shared import SharedArrays


class RateLimiter:
    def __init__(self, updates_per_step: float, min_steps: int = 0, tolerance: float | None = None,
                 insert_chunk: int = 1, sample_chunk: int = 1):
        if updates_per_step <= 0:
            raise ValueError(f"updates per step must be > 0, got {updates_per_step}")
        self.ratio = float(updates_per_step)
        self.min_steps = int(min_steps)
        if tolerance is None:
            tolerance = max(self.ratio * insert_chunk, sample_chunk)
        needed = max(self.ratio * insert_chunk, sample_chunk) / 2
        if tolerance < needed:
            raise ValueError(f"tolerance {tolerance} would deadlock inserts of {insert_chunk} steps and samples of "
                             f"{sample_chunk} updates at ratio {self.ratio}: use at least {needed}")
        self.tolerance = float(tolerance)
        offset = self.ratio * self.min_steps
        self.min_diff, self.max_diff = offset - self.tolerance, offset + self.tolerance
        self._counters = SharedArrays({"inserts": ((1,), np.int64), "updates": ((1,), np.int64)})
        self._inserts = self._counters["inserts"]
        self._updates = self._counters["updates"]

    @property
    def inserts(self) -> int:
        return int(self._inserts[0])

    @property
    def updates(self) -> int:
        return int(self._updates[0])

    @property
    def diff(self) -> float:
        return self.inserts * self.ratio - self.updates

    @property
    def achieved_ratio(self) -> float:
        """Updates per env step since the warm-up (0 before it ends)."""
        return self.updates / max(self.inserts - self.min_steps, 1) if self.inserts > self.min_steps else 0.0

    def can_insert(self, n: int = 1) -> bool:
        inserts = self.inserts + n
        return inserts <= self.min_steps or inserts * self.ratio - self.updates <= self.max_diff

    def can_sample(self, n: int = 1) -> bool:
        inserts = self.inserts
        return inserts >= self.min_steps and inserts * self.ratio - (self.updates + n) >= self.min_diff

    def inserted(self, n: int = 1) -> None:
        """Count n env steps inserted; only the inserting process calls this."""
        self._inserts[0] += n

    def sampled(self, n: int = 1) -> None:
        """Count n gradient updates; only the learner calls this."""
        self._updates[0] += n

    def wait_insert(self, n: int = 1, timeout: float = 1.0, stop: Callable[[], bool] | None = None) -> bool:
        return _wait(lambda: self.can_insert(n), timeout, stop)

    def wait_sample(self, n: int = 1, timeout: float = 1.0, stop: Callable[[], bool] | None = None) -> bool:
        return _wait(lambda: self.can_sample(n), timeout, stop)


def _wait(ready: Callable[[], bool], timeout: float, stop: Callable[[], bool] | None) -> bool:
    """Poll with a backoff from 20 us to 1 ms; False on timeout or when `stop()` says so."""
    deadline = time.monotonic() + timeout
    pause = 2e-5
    while not ready():
        if time.monotonic() > deadline or (stop is not None and stop()):
            return False
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return True
