"""Gradient updates per second of the off-policy learners (`--algo sac, td3, redq`) on Pendulum-shaped data.

Usage: `.venv/bin/python scripts/bench_updates.py [--updates 200]`. 256 x 256 networks, batches of 256 sampled
from a replay buffer of random transitions; prints the median time per update over 5 repeats for each algorithm.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from asyncrl.agents import registry
from asyncrl.agents.batch import Batch
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec

T, B = 8, 64


def random_batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(T + 1, B, 3, generator=g), actions=torch.rand(T, B, 1, generator=g) * 4 - 2,
        behaviour_logp=torch.zeros(T, B), rewards=torch.randn(T, B, generator=g),
        terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
        final_obs=torch.zeros(B, 3), final_step=torch.full((B,), -1), lag=torch.zeros(T, B, dtype=torch.long),
        valid=torch.ones(T, B, dtype=torch.bool))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=100, help="updates per timed repeat")
    args = parser.parse_args()
    spec = make_env_spec("Pendulum-v1")
    for algo in ("sac", "td3", "redq"):
        cfg = Config(env="Pendulum-v1", algo=algo, rollout=T, replay_size=100_000, learning_starts=0,
                     hidden_size=256, sac_batch_size=256).resolve()
        learner = registry.make_learner(cfg, spec, torch.device("cpu"))
        for i in range(20):
            learner.insert(random_batch(i))
        times = []
        for _ in range(6):  # the first repeat warms up
            t0 = time.perf_counter()
            for _ in range(args.updates):
                learner._update(learner._sample()[1])
            times.append((time.perf_counter() - t0) / args.updates)
        ms = 1000 * statistics.median(times[1:])
        print(f"{algo:5s} {learner.critic.num_critics:2d} critics: {ms:5.1f} ms per update, {1000 / ms:5.0f} updates/s "
              f"(torch threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
