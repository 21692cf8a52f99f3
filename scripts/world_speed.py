"""Env steps per second of the issue-56 backends on this machine, random actions, one process, no training:
docs/env-backends.md's speed figures.

    nice -n 19 .venv/bin/python scripts/world_speed.py mujoco       # playground:CheetahRun against gymnasium's
                                                                     # HalfCheetah-v5 and EnvPool's two cheetahs
    nice -n 19 .venv/bin/python scripts/world_speed.py envpool-async # EnvPool Pong: synchronous against async
    nice -n 19 .venv/bin/python scripts/world_speed.py playground    # Playground's Warp and JAX implementations

`mujoco` steps each env through asyncrl's backend (`make_vec_env`, writing into slot-shaped arrays) for
`--seconds` after a warm-up (JAX compiles Playground's step first; its compile time is printed apart).
`envpool-async` steps EnvPool's own pool (no asyncrl): `--envs` envs with batch_size = envs (synchronous) and
batch_size = envs / 2 (asynchronous: send the actions of the envs that came back, receive the next ready batch).
The load average is printed beside every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def through_asyncrl(name: str, n: int, seconds: float, **env_kwargs: object) -> None:
    from asyncrl.envs.registry import make_vec_env

    start = time.monotonic()
    env = make_vec_env(name, n, env_kwargs=env_kwargs)
    spec = env.spec
    obs = np.zeros((n, *spec.obs_shape), spec.obs_dtype)
    final, reward = obs.copy(), np.zeros(n, np.float32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    rng = np.random.default_rng(0)
    low, high = spec.action_space.low, spec.action_space.high
    pool = [rng.uniform(low, high, (n, *spec.action_shape)).astype(np.float32) for _ in range(16)]
    env.reset(0, obs)
    env.step(pool[0], obs, reward, term, trunc, final)  # compiles a JAX env's step
    ready = time.monotonic() - start
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        env.step(pool[steps % 16], obs, reward, term, trunc, final)
        steps += 1
    rate = steps * n / (time.monotonic() - t0)
    env.close()
    label = name + "".join(f" {k}={v}" for k, v in env_kwargs.items())
    print(f"{label:28s} {n:4d} envs: {rate:10,.0f} env steps/s (made and first step in {ready:.1f} s; {load()})",
          flush=True)


def envpool_async(task: str, n: int, threads: int, seconds: float) -> None:
    from asyncrl.envs.envpool_env import envpool_module

    envpool = envpool_module()
    for batch in (n, n // 2):
        pool = envpool.make_gymnasium(task, num_envs=n, batch_size=batch, num_threads=threads, seed=0)
        pool.async_reset()
        steps, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            _, _, _, _, info = pool.recv()
            ids = info["env_id"]
            pool.send(np.random.randint(0, 6, len(ids)), ids)
            steps += len(ids)
        rate = steps / (time.monotonic() - t0)
        pool.close()
        mode = "synchronous" if batch == n else "asynchronous"
        print(f"{task} {n} envs, batch {batch:3d} ({mode}), {threads} threads: {rate:8,.0f} env steps/s "
              f"({rate * 4:,.0f} frames/s; {load()})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("mujoco", "envpool-async", "playground"))
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    opts = p.parse_args()
    if opts.what == "envpool-async":
        envpool_async("Pong-v5", opts.envs, opts.threads, opts.seconds)
        return 0
    if opts.what == "playground":  # Playground's two MJX implementations; gymnasium's MuJoCo cart-pole beside them
        through_asyncrl("InvertedPendulum-v5", opts.envs, opts.seconds)
        for name in ("playground:CartpoleBalance", "playground:CheetahRun"):
            for impl in ("warp", "jax"):
                through_asyncrl(name, opts.envs, opts.seconds, impl=impl)
        return 0
    for name in ("HalfCheetah-v5", "envpool:HalfCheetah-v5", "envpool:CheetahRun-v1", "playground:CheetahRun"):
        through_asyncrl(name, opts.envs, opts.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
