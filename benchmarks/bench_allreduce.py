"""All-reduce cost per learner update for the data-parallel learners (asyncrl/runtime/distributed/group.py).

Two local gloo processes all-reduce what the learners exchange: the flattened gradient bucket (all parameters
plus the finite flag, float32) once per optimizer step, and the small per-update agreement vector (float64).
Prints a markdown table of the median (and 90th percentile) over many repetitions, each preceded by a barrier so
the ranks start together (the time measures the transfer, not one rank waiting for the other).

    .venv/bin/python benchmarks/bench_allreduce.py               # CartPole MLP and the Atari Nature CNN
    .venv/bin/python benchmarks/bench_allreduce.py --repeats 500
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.presets import preset_for

MODELS = {"CartPole-v1 (MLP)": "CartPole-v1", "atari_pong (Nature CNN)": "atari_pong"}
AGREEMENT_WORDS = 7  # env steps, episodes, 3 stop requests, trained samples, learning rate


def parameter_count(env: str) -> int:
    spec = make_env_spec(env)
    model = build_model(spec, preset_for(env).get("hidden_size", 64))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def worker(rank: int, world: int, port: int, sizes: dict[str, tuple[int, torch.dtype]], repeats: int,
           results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for name, (numel, dtype) in sizes.items():
        bucket = torch.randn(numel, dtype=torch.float32).to(dtype)
        times = []
        for i in range(repeats + 10):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(bucket)
            if i >= 10:  # warm-up
                times.append(time.perf_counter() - t0)
        if rank == 0:
            times.sort()
            results[name] = (statistics.median(times), times[int(0.9 * (len(times) - 1))])
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    sizes: dict[str, tuple[int, torch.dtype]] = {}
    params: dict[str, int] = {}
    for label, env in MODELS.items():
        params[label] = parameter_count(env)
        sizes[f"{label}: gradient bucket"] = (params[label] + 1, torch.float32)
    sizes["agreement vector (per update)"] = (AGREEMENT_WORDS, torch.float64)
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, free_port(), sizes, args.repeats, results), nprocs=2, join=True)
        results = dict(results)
    print(f"2 gloo processes on this machine ({os.cpu_count()} cores), torch {torch.__version__}, "
          f"median of {args.repeats} all-reduces (p90 in brackets)\n")
    print("| tensor | elements | bytes | all-reduce median (p90) | effective bus bandwidth |")
    print("| --- | --- | --- | --- | --- |")
    for name, (numel, dtype) in sizes.items():
        median, p90 = results[name]
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        bus = 2 * (2 - 1) / 2 * nbytes / median  # ring all-reduce moves 2(k-1)/k x bytes per rank
        print(f"| {name} | {numel:,} | {nbytes / 2**20:.2f} MiB | {median * 1e3:.3f} ms ({p90 * 1e3:.3f} ms) | "
              f"{bus / 1e9:.2f} GB/s |")


if __name__ == "__main__":
    main()
