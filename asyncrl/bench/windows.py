"""Turn per-window throughput into one benchmark record (median of the windows, plus every window)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from asyncrl.bench.machine import usable_cpus
from asyncrl.bench.settings import BenchSettings


def median_of(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def most_common(values: Sequence[str | None]) -> str | None:
    present = [v for v in values if v]
    return Counter(present).most_common(1)[0][0] if present else None


def make_record(s: BenchSettings, sps_windows: Sequence[float], frameskip: int, *,
                envs_per_worker: int | None = None, stages: dict[str, float | None] | None = None,
                limited_by: str | None = None, **extra: Any) -> dict[str, Any]:
    """The record every mode prints: env, mode, layout, median sps/fps, each window's sps, stages, extras.

    `us_per_step_per_core` is wall time (cores x 1e6 / sps); `cpu_us_per_step` is the CPU time the run's own
    processes spent per agent step, which a busy machine inflates far less.
    """
    if not sps_windows:
        raise ValueError("no measurement windows")
    sps = statistics.median(sps_windows)
    cores = usable_cpus()
    record: dict[str, Any] = {
        "env": s.env,
        "mode": s.mode,
        "workers": s.workers,
        "envs_per_worker": s.envs_per_worker if envs_per_worker is None else envs_per_worker,
        "sps": round(sps, 1),
        "fps": round(sps * frameskip, 1),
        "repeats": len(sps_windows),
        "window_s": round(s.window_s, 3),
        "sps_windows": [round(x, 1) for x in sps_windows],
        "sps_min": round(min(sps_windows), 1),
        "sps_max": round(max(sps_windows), 1),
        "frameskip": frameskip,
        "us_per_step_per_core": round(cores * 1e6 / sps, 2) if sps > 0 else None,
        "rollout": s.rollout,
        "batch_size": s.batch_size,
        "hidden_size": s.hidden_size,
        "limited_by": limited_by,
        "stages": {k: (None if v is None else round(v, 3)) for k, v in (stages or {}).items()},
    }
    cpu_run = (stages or {}).get("cpu_run")  # % of all cores the measured processes used
    record["cpu_us_per_step"] = round(cpu_run / 100 * cores * 1e6 / sps, 2) if cpu_run and sps > 0 else None
    record.update(extra)
    return record
