"""Gradient updates per second of the learners on random data: the off-policy ones (`--algo sac, td3, redq`) on
Pendulum-shaped transitions, APPO on a CartPole-v1 batch of the vector preset.

Usage: `.venv/bin/python benchmarks/bench_updates.py [--updates 200] [--algos appo sac]`. Off-policy: 256 x 256
networks, batches of 256 sampled from a replay buffer of random transitions. APPO: the preset's 64 x 64 MLPs and
one update (a batch of 256 samples: 8 epochs x 2 minibatches, 16 optimizer steps). Prints the median time per
update over 5 repeats for each algorithm (`--threads 1`: one torch thread, as an APPO learner beside its workers
on 2 cores).
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
from asyncrl.resolve import config_from_flags

T, B = 8, 64


def random_batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(T + 1, B, 3, generator=g), actions=torch.rand(T, B, 1, generator=g) * 4 - 2,
        behaviour_logp=torch.zeros(T, B), rewards=torch.randn(T, B, generator=g),
        terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
        final_obs=torch.zeros(B, 3), final_step=torch.full((B,), -1), lag=torch.zeros(T, B, dtype=torch.long),
        valid=torch.ones(T, B, dtype=torch.bool))


def appo_update_ms(repeats: int, updates: int) -> tuple[float, int, int]:
    """Median ms per APPO update on the vector preset's CartPole-v1 batch, its optimizer steps and samples."""
    import numpy as np

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.agents.batch import gather_batch
    from asyncrl.runtime.plumbing.trajectories import allocate_trajectories

    cfg = config_from_flags(env="CartPole-v1", env_vectorization="loop", device="cpu", train_dir="/tmp")
    spec = make_env_spec(cfg)
    traj = allocate_trajectories(cfg, spec)
    rng = np.random.default_rng(0)
    traj["obs"][...] = rng.standard_normal(traj["obs"].shape)
    traj["actions"][...] = rng.integers(0, 2, traj["actions"].shape)
    traj["rewards"][...], traj["logp"][...], traj["valid"][...], traj["final_step"][...] = 1.0, np.log(0.5), True, -1
    slots = np.arange(cfg.batch_size // (cfg.rollout * cfg.envs_per_split))
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    times = []
    for _ in range(repeats + 1):  # the first repeat warms up
        t0 = time.perf_counter()
        for _ in range(updates):
            learner.train(gather_batch(traj, slots, 1, torch.device("cpu")), 0)
        times.append((time.perf_counter() - t0) / updates)
    return 1000 * statistics.median(times[1:]), cfg.epochs * cfg.minibatches, cfg.batch_size


def off_policy_update_ms(algo: str, repeats: int, updates: int) -> tuple[float, int]:
    """Median ms per update of `algo` on random Pendulum transitions, and its number of critics."""
    spec = make_env_spec("Pendulum-v1")
    cfg = Config(env="Pendulum-v1", algo=algo, rollout=T, replay_size=100_000, learning_starts=0,
                 hidden_size=256, sac_batch_size=256).resolve()
    learner = registry.make_learner(cfg, spec, torch.device("cpu"))
    for i in range(20):
        learner.insert(random_batch(i))
    times = []
    for _ in range(repeats + 1):  # the first repeat warms up
        t0 = time.perf_counter()
        for _ in range(updates):
            learner._update(learner._sample()[1])
        times.append((time.perf_counter() - t0) / updates)
    return 1000 * statistics.median(times[1:]), learner.critic.num_critics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=100, help="updates per timed repeat")
    parser.add_argument("--algos", nargs="+", choices=("appo", "sac", "td3", "redq"),
                        default=["appo", "sac", "td3", "redq"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for algo in args.algos:
        if algo == "appo":
            ms, steps, samples = appo_update_ms(5, args.updates)
            print(f"appo  CartPole-v1 vector preset: {ms:5.1f} ms per update ({steps} optimizer steps, "
                  f"{ms / steps:.2f} ms each), {samples / ms * 1000:6.0f} samples/s (torch threads "
                  f"{torch.get_num_threads()})")
            continue
        ms, critics = off_policy_update_ms(algo, 5, args.updates)
        print(f"{algo:5s} {critics:2d} critics: {ms:5.1f} ms per update, {1000 / ms:5.0f} updates/s "
              f"(torch threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
