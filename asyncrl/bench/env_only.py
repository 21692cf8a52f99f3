"""`env_only`: the env backend stepping random actions with no policy, in one process per sampler worker.

Each process owns `worker_splits` VecEnvs of `envs_per_split` envs (exactly what a rollout worker steps) and
steps them in turn. All processes start together and count their steps at common window boundaries; a
window's figure is the sum of the processes' rates. The first window is warm-up and is dropped.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from typing import Any

import numpy as np

from asyncrl.bench.machine import usable_cpus
from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.windows import make_record

ACTION_POOL = 64  # pre-drawn random action batches, cycled (drawing per step would bill the RNG to the env)
JOIN_SLACK_S = 120.0


def _random_actions(spec, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    if spec.discrete:
        return [rng.integers(0, spec.num_actions, n) for _ in range(ACTION_POOL)]
    if spec.multi_discrete:
        return [rng.integers(0, spec.nvec, (n, len(spec.nvec))) for _ in range(ACTION_POOL)]
    if spec.is_tuple:  # each part in the flat vector: random indices, uniform Box values
        return [np.concatenate([rng.integers(0, p.nvec, (n, p.width)).astype(np.float32) if p.kind != "box" else
                                rng.uniform(p.space.low, p.space.high, (n, p.width)).astype(np.float32)
                                for p in spec.parts], axis=1) for _ in range(ACTION_POOL)]
    low, high = spec.action_space.low, spec.action_space.high
    return [rng.uniform(low, high, (n, *spec.action_shape)).astype(np.float32) for _ in range(ACTION_POOL)]


def _step_worker(index: int, s: BenchSettings, barrier: Any, results: Any) -> None:
    """Child process: build the envs, wait for the others, step until the last window boundary."""
    envs = []
    try:
        from asyncrl.envs.registry import make_vec_env

        n = s.envs_per_split
        envs = [make_vec_env(s.env, n, training=True) for _ in range(s.worker_splits)]
        spec = envs[0].spec
        rng = np.random.default_rng(index)
        pool = _random_actions(spec, n, rng)
        bufs = [(np.zeros((n, *spec.obs_shape), spec.obs_dtype), np.zeros(n, np.float32), np.zeros(n, np.bool_),
                 np.zeros(n, np.bool_), np.zeros((n, *spec.obs_shape), spec.obs_dtype)) for _ in envs]
        for i, (env, (obs, *_)) in enumerate(zip(envs, bufs)):
            env.reset(seed=1000 * index + n * i, obs_out=obs)
        barrier.wait()
        t0 = time.monotonic()
        boundaries = [t0 + s.window_s * (k + 1) for k in range(s.repeats + 1)]  # warm-up + repeats
        marks: list[tuple[float, int, float]] = [(t0, 0, time.process_time())]
        steps = k = 0
        while k < len(boundaries):
            for env, (obs, rew, terminated, truncated, final_obs) in zip(envs, bufs):
                env.step(pool[steps % ACTION_POOL], obs, rew, terminated, truncated, final_obs)
                steps += 1
            now = time.monotonic()
            if now >= boundaries[k]:
                marks.append((now, steps * n, time.process_time()))
                k += 1
        results.put((index, "ok", marks, spec.frameskip))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put((index, "error", traceback.format_exc(), 1))
        barrier.abort()
    finally:
        for env in envs:
            env.close()


Marks = list[tuple[float, int, float]]  # (monotonic time, env steps, process CPU seconds) at each boundary


def window_rates(marks_by_proc: list[Marks]) -> list[float]:
    """Summed steps/s per window, over processes; window 0 (warm-up) is dropped."""
    n_windows = min(len(m) for m in marks_by_proc) - 1
    return [sum((m[w + 1][1] - m[w][1]) / (m[w + 1][0] - m[w][0]) for m in marks_by_proc)
            for w in range(1, n_windows)]


def cpu_percent(marks_by_proc: list[Marks], cores: int) -> float:
    """CPU the stepping processes used over the measured windows, as a percentage of the whole machine."""
    cpu = sum(m[-1][2] - m[1][2] for m in marks_by_proc)
    wall = max(m[-1][0] for m in marks_by_proc) - min(m[1][0] for m in marks_by_proc)
    return 100.0 * cpu / (wall * cores) if wall > 0 else 0.0


def run_env_only(s: BenchSettings) -> dict[str, Any]:
    ctx = mp.get_context("fork")  # the caller is torch-free; children import only the env backend
    barrier = ctx.Barrier(s.workers)
    results = ctx.Queue()
    procs = [ctx.Process(target=_step_worker, args=(i, s, barrier, results), daemon=True) for i in range(s.workers)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + s.window_s * (s.repeats + 1) + JOIN_SLACK_S
        marks: list[Marks] = []
        frameskip = 1
        for _ in procs:
            index, status, payload, frameskip = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if status != "ok":
                raise RuntimeError(f"env_only process {index} failed:\n{payload}")
            marks.append(payload)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return make_record(s, window_rates(marks), frameskip, limited_by="env",
                       stages={"cpu_run": cpu_percent(marks, usable_cpus())},
                       envs_per_split=s.envs_per_split, worker_splits=s.worker_splits)
