"""A trial's progress read from its runs' metrics.jsonl while they write it, and its score over seeds."""

from __future__ import annotations

import json
import math
import os
import statistics

# Two-sided 95% Student t quantiles by degrees of freedom (1..10); 1.96 beyond 30, and a linear blend between.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


class MetricsTail:
    """The (frames, value) points of one metric in a growing metrics.jsonl, read a new chunk at each `poll`."""

    def __init__(self, run_dir: str, metric: str) -> None:
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.metric = metric
        self.points: list[tuple[int, float]] = []
        self.frames = 0  # the newest record's frames
        self._offset = 0
        self._partial = ""

    def poll(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # a record still being written
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            frames = record.get("frames")
            if not isinstance(frames, int | float):
                continue
            self.frames = max(self.frames, int(frames))
            value = record.get(self.metric)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.points.append((int(frames), float(value)))


def score(points: list[tuple[int, float]], last: int, upto: int | None = None) -> float | None:
    """The mean of the last `last` values at or before `upto` frames (all of them if None); None if there is none."""
    values = [v for f, v in points if upto is None or f <= upto][-last:]
    return statistics.fmean(values) if values else None


def t95(n: int) -> float:
    """The two-sided 95% t quantile with n - 1 degrees of freedom."""
    df = n - 1
    if df <= len(T95):
        return T95[df - 1]
    return 1.96 if df >= 30 else T95[-1] + (1.96 - T95[-1]) * (df - len(T95)) / (30 - len(T95))


def interval(values: list[float]) -> tuple[float, float] | None:
    """The 95% t interval of the mean of `values` (the seeds' scores); None for one value."""
    if len(values) < 2:
        return None
    mean, half = statistics.fmean(values), t95(len(values)) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half
