"""SAC's gradient update on Pendulum-v1, eager against --compile learner, in one process on one torch thread.

    .venv/bin/python scripts/compile_sac_update.py --blocks 6 --updates 200

Both learners are built with the `--algo sac --env Pendulum-v1` preset (256 x 256 networks, batches of 256
transitions) and the same weights, their replay buffers filled with the same random transitions; blocks of
`--updates` updates then alternate eager / compiled (A B A B ...), each block timed alone. Prints the compile
(warm-up) time, each arm's median updates/s over the blocks, the ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from asyncrl.agents import registry
from asyncrl.agents.batch import Batch
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.resolve import parse_config


def learner(compile_: str):  # type: ignore[no-untyped-def]
    cfg = parse_config(["--env", "Pendulum-v1", "--algo", "sac", "--compile", compile_, "--learning-starts", "0"])
    torch.manual_seed(0)
    return cfg, registry.make_learner(cfg, make_env_spec("Pendulum-v1"), torch.device("cpu"))


def fill(lrn, cfg: Config, batches: int) -> None:  # type: ignore[no-untyped-def]
    t, b = cfg.rollout, cfg.envs_per_worker
    g = torch.Generator().manual_seed(1)
    for _ in range(batches):
        lrn.insert(Batch(obs=torch.randn(t + 1, b, 3, generator=g), actions=torch.rand(t, b, 1, generator=g) * 4 - 2,
                         behaviour_logp=torch.zeros(t, b), rewards=torch.randn(t, b, generator=g),
                         terminated=torch.zeros(t, b, dtype=torch.bool), truncated=torch.zeros(t, b, dtype=torch.bool),
                         final_obs=torch.zeros(b, 3), final_step=torch.full((b,), -1), lag=torch.zeros(t, b),
                         valid=torch.ones(t, b, dtype=torch.bool)))


def block(lrn, n: int) -> float:  # type: ignore[no-untyped-def]
    """Updates per second over `n` updates (sampling from the replay buffer included, as in training)."""
    t0 = time.perf_counter()
    for _ in range(n):
        lrn._update(lrn._sample()[1])
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--updates", type=int, default=200)
    a = parser.parse_args()
    torch.set_num_threads(1)
    arms = {}
    for name, value in (("eager", "none"), ("compiled", "learner")):
        cfg, lrn = learner(value)
        fill(lrn, cfg, 100)
        warm = lrn.warm_up() if value != "none" else 0.0
        arms[name] = (lrn, warm)
    rates: dict[str, list[float]] = {name: [] for name in arms}
    loads = [os.getloadavg()[0]]
    for name in arms:
        block(arms[name][0], 20)  # first calls
    for i in range(a.blocks):
        for name in (list(arms) if i % 2 == 0 else list(reversed(arms))):
            rates[name].append(block(arms[name][0], a.updates))
        loads.append(os.getloadavg()[0])
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"| {name} | {med[name]:,.0f} | {', '.join(f'{x:,.0f}' for x in r)} | {arms[name][1]:.1f} s |")
    print(f"compiled / eager = {med['compiled'] / med['eager']:.2f}; load {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
