"""The runner's progress line, with percent done and an ETA when the run has a --frames or --seconds limit."""

from __future__ import annotations

from collections import deque
from typing import Any

RATE_WINDOW = 5  # the ETA uses the frame rate over the last 5 report intervals (steadier than one interval's)


def format_duration(seconds: float) -> str:
    """`45s`, `12m05s`, `3h07m`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLine:
    """Formats one line per report; keeps the recent (time, frames) points for the ETA."""

    def __init__(self, frames_limit: int = 0, seconds_limit: float = 0.0):
        self.frames_limit, self.seconds_limit = frames_limit, seconds_limit
        # (run time, frames) of the recent reports; the run's start (0, 0) until the window fills (time and frames
        # both continue across --resume, so the origin stays valid)
        self._points: deque[tuple[float, int]] = deque([(0.0, 0)], maxlen=RATE_WINDOW + 1)

    def done_and_eta(self, elapsed: float, frames: int, loop_seconds: float | None = None
                     ) -> tuple[float, float | None] | None:
        """(fraction done, seconds left or None while unknown) of the limit reached first; None without limits.

        `elapsed` is the run's time (the x of the frame rate); `loop_seconds` the time --seconds counts (since
        this launch's training loop began; `elapsed` when not given).
        """
        self._points.append((elapsed, frames))
        estimates: list[tuple[float, float | None]] = []
        if self.frames_limit > 0:
            (t0, f0), (t1, f1) = self._points[0], self._points[-1]
            rate = (f1 - f0) / (t1 - t0) if t1 > t0 and f1 > f0 else None
            left = max(0, self.frames_limit - frames)
            estimates.append((frames / self.frames_limit, left / rate if rate else None))
        if self.seconds_limit > 0:
            ran = elapsed if loop_seconds is None else loop_seconds
            estimates.append((ran / self.seconds_limit, max(0.0, self.seconds_limit - ran)))
        if not estimates:
            return None
        known = [e for e in estimates if e[1] is not None]
        return min(known, key=lambda e: e[1]) if known else max(estimates, key=lambda e: e[0])

    def line(self, record: dict[str, Any], loop_seconds: float | None = None) -> str:
        ret, lag, lag_max = record["episode_return_mean"], record["policy_lag_mean"], record["policy_lag_max"]
        text = (f"[{record['time']:7.0f}s] frames {record['frames']:>12,} | fps {record['fps']:8,.0f} | "
                f"return {'-' if ret is None else f'{ret:7.2f}'} ({record['episodes']} eps) | "
                f"version {record['policy_version']} lag {'-' if lag is None else f'{lag:.1f}/{lag_max}'} "
                f"dropped {record['dropped_stale']}")
        progress = self.done_and_eta(record["time"], record["frames"], loop_seconds)
        if progress is not None:
            done, eta = progress
            text += f" | {min(done, 1.0):.0%} eta {'-' if eta is None else format_duration(eta)}"
        return text
