"""Replay throughput: insert and sample transitions/s at 1M capacity, uniform and prioritized, and the time
of one prioritized-replay update of 256 priorities.

    .venv/bin/python scripts/bench_replay.py                  # Pendulum-like (3 float32) and Atari-like (84x84 uint8)
    .venv/bin/python scripts/bench_replay.py --atari-fill 200000   # touch less memory (capacity stays 1M)

Inserts are chunks of T = 32 steps x B = 64 envs (2048 transitions, a learner batch); samples are batches of
256. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from asyncrl.replay.buffer import ReplayBuffer, check_fits, memory_bytes
from asyncrl.replay.prioritized import PrioritizedReplay

T, B, BATCH = 32, 64, 256


def chunk(obs_shape: tuple[int, ...], obs_dtype: type, action_shape: tuple[int, ...], action_dtype: type,
          rng: np.random.Generator) -> dict[str, np.ndarray]:
    if np.dtype(obs_dtype) == np.uint8:
        obs = rng.integers(0, 256, (T + 1, B, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((T + 1, B, *obs_shape)).astype(obs_dtype)
    truncated = np.zeros((T, B), bool)
    truncated[T // 2, ::8] = True  # a few time-limit ends per chunk
    return dict(obs=obs, actions=np.zeros((T, B, *action_shape), action_dtype),
                rewards=rng.standard_normal((T, B)).astype(np.float32), terminated=rng.random((T, B)) < 0.01,
                truncated=truncated, versions=np.arange(T), final_obs=obs[T // 2 + 1, ::8].copy())


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds per call."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def bench(name: str, obs_shape: tuple[int, ...], obs_dtype: type, action_shape: tuple[int, ...], action_dtype: type,
          capacity: int, fill: int, rows: list[str]) -> None:
    rng = np.random.default_rng(0)
    nbytes = memory_bytes(capacity, obs_shape, obs_dtype, action_shape, action_dtype, segment_len=T)
    check_fits(nbytes)
    data = chunk(obs_shape, obs_dtype, action_shape, action_dtype, rng)
    for prioritized in (False, True):
        buf = ReplayBuffer(capacity, obs_shape, obs_dtype, action_shape, action_dtype, segment_len=T)
        replay = PrioritizedReplay(buf) if prioritized else buf
        inserts = max(1, fill // (T * B))
        start = time.perf_counter()
        for _ in range(inserts):  # first touch of the pages: includes the kernel's page faults
            replay.insert(**data)
        cold_rate = inserts * T * B / (time.perf_counter() - start)
        saved = buf.counters.copy()
        buf.counters[0] = 0  # rewrite the start of the ring: memory already touched, as in a long run
        again = min(inserts, max(1, 200_000 // (T * B)))
        start = time.perf_counter()
        for _ in range(again):
            replay.insert(**data)
        insert_rate = again * T * B / (time.perf_counter() - start)
        buf.counters[:] = saved
        sample_s = timed(lambda r=replay: r.sample(BATCH, rng), 200)
        kind = "prioritized" if prioritized else "uniform"
        row = (f"| {name} | {kind} | {buf.size:,} | {nbytes / 2**30:.2f} | {insert_rate / 1e6:.2f} M "
               f"({cold_rate / 1e6:.2f} M first fill) | {BATCH / sample_s / 1e6:.2f} M ({sample_s * 1e6:.0f} us) |")
        if prioritized:
            idx = replay.sample(BATCH, rng).indices
            td = rng.standard_normal(BATCH)
            update_s = timed(lambda r=replay, i=idx, e=td: r.update_priorities(i, e), 1000)
            row += f" {update_s * 1e6:.0f} us |"
        else:
            row += " - |"
        rows.append(row)
        print(row, flush=True)
        del buf, replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--atari-fill", type=int, default=1_000_000, help="transitions inserted into the Atari buffer")
    args = parser.parse_args()
    print("| observation | sampling | held | buffer GiB | insert transitions/s | sample transitions/s "
          f"(per batch of {BATCH}) | PER update of {BATCH} |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows: list[str] = []
    bench("Pendulum-like 3 x float32", (3,), np.float32, (1,), np.float32, args.capacity, args.capacity, rows)
    bench("Atari-like 84x84 uint8", (84, 84), np.uint8, (), np.int64, args.capacity, args.atari_fill, rows)


if __name__ == "__main__":
    main()
