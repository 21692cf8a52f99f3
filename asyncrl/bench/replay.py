"""`replay`: replay-buffer throughput at 1M capacity, uniform and prioritized, in this process.

Two observation kinds: Pendulum-like (3 float32) and Atari-like (84x84 uint8). Inserts are chunks of T = 32
steps x B = 64 envs (2,048 transitions, a learner batch); samples are batches of 256; the prioritized buffer
also times one update of 256 priorities. Each buffer is first filled once (`first_fill_per_s`: the kernel's
page faults included), with the fill bounded to `replay_fill_gib` of touched memory, so the Atari-like buffer
keeps its 1M capacity (and its sum tree) without needing 7 GiB of RAM. Then come three timed figures, each the
median of `repeats` windows of `window_s` after one warm-up window: inserts that rewrite the filled part of the
ring (memory already touched, as in a long run), samples, and (prioritized) priority updates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncrl.bench.settings import BenchSettings
from asyncrl.config import ConfigError
from asyncrl.replay.buffer import ReplayBuffer, check_fits, memory_bytes
from asyncrl.replay.prioritized import PrioritizedReplay

T, B = 32, 64  # one inserted chunk: T steps x B envs
BATCH = 256  # transitions per sample, and priorities per PER update
_NEXT_SEGMENT = 0  # ReplayBuffer.counters index of the next segment to write


@dataclass(frozen=True)
class ReplayCase:
    """One observation kind."""

    name: str
    label: str
    obs_shape: tuple[int, ...]
    obs_dtype: type
    action_shape: tuple[int, ...]
    action_dtype: type

    def memory_bytes(self, capacity: int) -> int:
        return memory_bytes(capacity, self.obs_shape, self.obs_dtype, self.action_shape, self.action_dtype,
                            segment_len=T)


CASES = (
    ReplayCase("pendulum", "Pendulum-like 3 x float32", (3,), np.float32, (1,), np.float32),
    ReplayCase("atari", "Atari-like 84x84 uint8", (84, 84), np.uint8, (), np.int64),
)


def chunk(case: ReplayCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One T x B insert with random observations and rewards and a few time-limit ends."""
    if np.dtype(case.obs_dtype) == np.uint8:
        obs = rng.integers(0, 256, (T + 1, B, *case.obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((T + 1, B, *case.obs_shape)).astype(case.obs_dtype)
    truncated = np.zeros((T, B), bool)
    truncated[T // 2, ::8] = True
    return dict(obs=obs, actions=np.zeros((T, B, *case.action_shape), case.action_dtype),
                rewards=rng.standard_normal((T, B)).astype(np.float32), terminated=rng.random((T, B)) < 0.01,
                truncated=truncated, versions=np.arange(T), final_obs=obs[T // 2 + 1, ::8].copy())


def fill_for(case: ReplayCase, capacity: int, fill_gib: float) -> tuple[int, int]:
    """(transitions to insert, bytes that touches): the whole capacity, or what `fill_gib` of memory holds.

    Touched bytes: the observation-free arrays of the full capacity (initialised on construction) plus the
    filled share of the rest.
    """
    total = case.memory_bytes(capacity)
    fixed = memory_bytes(capacity, (), case.obs_dtype, case.action_shape, case.action_dtype, segment_len=T)
    per_transition = (total - fixed) / capacity
    fill = min(capacity, int(fill_gib * 2**30 / per_transition))
    fill = max(T * B, fill // (T * B) * (T * B))  # whole chunks, at least one
    return fill, int(fixed + per_transition * fill)


def timed_windows(fn: Callable[[], int], window_s: float, repeats: int) -> list[float]:
    """Units per second of `fn` (it returns the units one call did) in `repeats` windows after a warm-up window."""
    rates = []
    for _ in range(repeats + 1):
        units, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < window_s or units == 0:
            units += fn()
        rates.append(units / elapsed)
    return rates[1:]


def measure(case: ReplayCase, prioritized: bool, capacity: int, fill: int, window_s: float, repeats: int,
            seed: int = 0) -> dict[str, Any]:
    """One buffer: first fill, then insert, sample and (prioritized) PER-update windows."""
    rng = np.random.default_rng(seed)
    data = chunk(case, rng)
    buf = ReplayBuffer(capacity, case.obs_shape, case.obs_dtype, case.action_shape, case.action_dtype,
                       segment_len=T)
    replay: ReplayBuffer | PrioritizedReplay = PrioritizedReplay(buf) if prioritized else buf
    inserts = max(1, fill // (T * B))
    start = time.perf_counter()
    for _ in range(inserts):
        replay.insert(**data)
    first_fill = inserts * T * B / (time.perf_counter() - start)
    held = buf.size
    filled_segments = min(inserts * B, buf.segments)
    saved = buf.counters.copy()

    def insert() -> int:  # rewrite the filled part of the ring: memory already touched
        if buf.counters[_NEXT_SEGMENT] + B > filled_segments:
            buf.counters[_NEXT_SEGMENT] = 0
        replay.insert(**data)
        return T * B

    insert_rates = timed_windows(insert, window_s, repeats)
    buf.counters[:] = saved
    sample_rates = timed_windows(lambda: (replay.sample(BATCH, rng), BATCH)[1], window_s, repeats)
    row: dict[str, Any] = {
        "observation": case.name, "obs_shape": list(case.obs_shape), "obs_dtype": np.dtype(case.obs_dtype).name,
        "sampling": "prioritized" if prioritized else "uniform", "capacity": buf.capacity, "held": held,
        "buffer_gib": round(case.memory_bytes(capacity) / 2**30, 3),
        "insert_per_s": round(statistics.median(insert_rates), 1),
        "insert_windows": [round(r, 1) for r in insert_rates],
        "first_fill_per_s": round(first_fill, 1),
        "sample_per_s": round(statistics.median(sample_rates), 1),
        "sample_windows": [round(r, 1) for r in sample_rates],
        "sample_us": round(BATCH / statistics.median(sample_rates) * 1e6, 1),
        "per_update_us": None,
    }
    if isinstance(replay, PrioritizedReplay):
        indices = replay.sample(BATCH, rng).indices
        td = rng.standard_normal(BATCH)
        per = replay  # bound for the closure
        update_rates = timed_windows(lambda: (per.update_priorities(indices, td), 1)[1], window_s, repeats)
        row["per_update_us"] = round(1e6 / statistics.median(update_rates), 2)
        row["per_update_us_windows"] = [round(1e6 / r, 2) for r in update_rates]
    return row


def run_replay(s: BenchSettings) -> dict[str, Any]:
    """Every case, uniform then prioritized, each in a fresh buffer; a case that does not fit is a skipped row."""
    rows: list[dict[str, Any]] = []
    for case in CASES:
        fill, touched = fill_for(case, s.replay_capacity, s.replay_fill_gib)
        try:
            check_fits(touched, what=f"{case.label} replay benchmark")
        except ConfigError as exc:
            rows.append({"observation": case.name, "sampling": "-", "capacity": s.replay_capacity,
                         "skipped": f"{exc} (or lower --replay-fill-gib)"})
            continue
        for prioritized in (False, True):
            row = measure(case, prioritized, s.replay_capacity, fill, s.window_s, s.repeats)
            row["touched_gib"] = round(touched / 2**30, 3)
            rows.append(row)
    return {"env": "replay", "mode": "replay", "capacity": s.replay_capacity, "fill_gib": s.replay_fill_gib,
            "chunk": [T, B], "batch": BATCH, "repeats": s.repeats, "window_s": round(s.window_s, 3),
            "replay": rows}

