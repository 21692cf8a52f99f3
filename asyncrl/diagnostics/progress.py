"""The runner's progress line, with percent done and an ETA when the run has a --frames or --seconds limit.

`[  125s] frames 1,204,224 | fps 9,512 | return -12.40 (311 eps) | version 1176 lag mean 1.2 max 3 of 4 dropped 0%`:
run time, frames so far, frames per second over the report interval (`fps ... mean`: the mean over the last 5
intervals, for a tail shorter than half the interval before it, whose own rate is noise), the mean return of the
last 100 episodes (and episodes so far), the learner's policy version, the policy lag of the last interval's trained
samples (mean and max, in updates; `of N`: --max-policy-lag, past which samples are dropped) and the share of the
samples the learner received that it dropped as too stale. docs/troubleshooting.md explains each field.
"""

from __future__ import annotations

from collections import deque
from typing import Any

RATE_WINDOW = 5  # the ETA uses the frame rate over the last 5 report intervals (steadier than one interval's)
SHORT_TAIL = 0.5  # an interval shorter than this share of the one before shows the recent mean fps instead


def dropped_share(record: dict[str, Any]) -> str:
    """`0%`, `<1%`, `12%`: the record's `dropped_share` (of the samples the learner received), or for a record
    without one its dropped samples over its env steps (at most 100%)."""
    share = record.get("dropped_share")
    if share is None:
        dropped, steps = record["dropped_stale"], record.get("env_steps", record["frames"])
        share = min(1.0, dropped / steps) if dropped > 0 and steps > 0 else 0.0
    if share <= 0:
        return "0%"
    return "<1%" if share < 0.01 else f"{share:.0%}"


def lag_text(record: dict[str, Any]) -> str:
    """`lag mean 1.7 max 3 of 4` (`of N`: the record's `policy_lag_limit`, absent for the replay learners)."""
    lag, lag_max = record.get("policy_lag_mean"), record.get("policy_lag_max")
    if lag is None:
        return "lag -"
    limit = record.get("policy_lag_limit")
    return f"lag mean {lag:.1f} max {lag_max}" + ("" if limit is None else f" of {limit}")


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
        self._last_dt: float | None = None  # the length of the interval before (run time between two lines)

    def fps_text(self, record: dict[str, Any]) -> str:
        """`fps    9,512`, or the mean over the last 5 lines (`fps 9,480 mean`) for a short tail interval
        (the last record of a run that stopped just after a report: a few steps over a few ms)."""
        (t0, f0), (t1, _) = self._points[0], self._points[-1]
        dt = record["time"] - t1
        short = self._last_dt is not None and dt < SHORT_TAIL * self._last_dt
        self._last_dt = dt if not short else self._last_dt
        if short and record["time"] > t0:
            return f"fps {(record['frames'] - f0) / (record['time'] - t0):8,.0f} mean"
        return f"fps {record['fps']:8,.0f}"

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
        """The line for one metrics record (`loop_seconds`: the time --seconds counts)."""
        ret = record["episode_return_mean"]
        text = (f"[{record['time']:7.0f}s] frames {record['frames']:>12,} | {self.fps_text(record)} | "
                f"return {'-' if ret is None else f'{ret:7.2f}'} ({record['episodes']} eps) | "
                f"version {record['policy_version']} {lag_text(record)} "
                f"dropped {dropped_share(record)}")
        progress = self.done_and_eta(record["time"], record["frames"], loop_seconds)
        if progress is not None:
            done, eta = progress
            text += f" | {min(done, 1.0):.0%} eta {'-' if eta is None else format_duration(eta)}"
        return text
