"""Env-only stepping cost of a MuJoCo task: gymnasium's Python loop against EnvPool's C++ pool, per CPU core.

Reports env steps per CPU-second of this process (time.process_time, all threads), which holds on a busy
machine where wall-clock rates do not, and steps per wall-second. EnvPool is optional (`pip install envpool`).

    python benchmarks/envpool_vs_gym.py --env HalfCheetah-v5 --envs 8 --steps 20000
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np


def measure(step_batch, reset, num_envs: int, steps: int, act_dim: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, (num_envs, act_dim)) for _ in range(64)]
    reset()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps // num_envs):
        step_batch(actions[i % 64])
    done = steps // num_envs * num_envs
    return done / (time.process_time() - c0), done / (time.perf_counter() - t0)


def gymnasium_loop(env_id: str, num_envs: int, steps: int) -> tuple[float, float]:
    envs = [gym.make(env_id) for _ in range(num_envs)]

    def reset() -> None:
        for i, env in enumerate(envs):
            env.reset(seed=i)

    def step_batch(actions: np.ndarray) -> None:
        for env, action in zip(envs, actions):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()

    act_dim = envs[0].action_space.shape[0]
    return measure(step_batch, reset, num_envs, steps, act_dim)


def envpool_pool(env_id: str, num_envs: int, steps: int) -> tuple[float, float]:
    import envpool

    pool = envpool.make_gymnasium(env_id, num_envs=num_envs, num_threads=1, seed=0)  # one core, auto-reset inside
    return measure(pool.step, pool.reset, num_envs, steps, pool.action_space.shape[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    for name, fn in (("gymnasium", gymnasium_loop), ("envpool", envpool_pool)):
        try:
            per_cpu, per_wall = fn(args.env, args.envs, args.steps)
        except ImportError as exc:
            print(f"{name:10s} not available: {exc}")
            continue
        print(f"{name:10s} {args.env} x{args.envs}: {per_cpu:9,.0f} steps per CPU-second, {per_wall:9,.0f} per "
              f"wall-second")


if __name__ == "__main__":
    main()
