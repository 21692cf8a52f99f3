#!/usr/bin/env python3
"""What makes a recurrent policy's encoder features grow: APPO updates on fixed Pong data, one change at a time.

    python benchmarks/value_offset.py --slots 64 --updates 30 --variants full no_value value_at_mean --rnn lstm

Collects `--slots` trajectory slots (`--envs`, 16 envs, x 32 steps each) with the real policy and rollout workers
acting from the initial weights, then trains a fresh learner on them for `--updates` updates per variant (two slots
a batch, the data relabelled as fresh so that nothing is masked as stale) and prints the RMS of the encoder's
features on one env's frames. Variants: `full` (the APPO loss as it is), `no_value` (value coefficient 0),
`value_at_mean` (the value head's bias set so that its output starts at `--value-start`, near the V-trace targets'
mean, -1.7 to -2.1 on this data, instead of near 0), `center_values` (`--center-values`: V-trace reads the head plus
an offset refitted at every step to the targets' mean gap to the head, which learns the targets minus it).
What docs/results.md measured the LSTM's runaway features with.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.roles forks the workers as the tests do

VARIANTS = ("full", "no_value", "value_at_mean", "center_values")


def collect(cfg, spec, slots: int) -> dict[str, np.ndarray]:
    """`slots` consecutive full slots, acted by the real forked workers with a fresh learner's first weights."""
    import torch

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.runtime.plumbing.wiring import build_wiring
    from asyncrl.runtime.roles.learner import WeightsPublisher
    from tests.roles import fork_roles, stop_roles

    wiring = build_wiring(cfg, spec)
    torch.manual_seed(0)
    WeightsPublisher(APPOLearner(cfg, spec, torch.device("cpu")).policy_module(), wiring.weights[0]).publish(1)
    children = fork_roles(wiring, ("policy-0", "rollout-0"))
    taken = []
    try:
        for _ in range(slots):
            slot = wiring.channels.full.get(timeout=300)
            taken.append({k: a[slot].copy() for k, a in wiring.traj.items()})
            wiring.channels.free.put(slot)
    finally:
        stop_roles(wiring, children)
    return {k: np.stack([s[k] for s in taken]) for k in taken[0]}


def train(cfg, spec, traj: dict[str, np.ndarray], variant: str, updates: int, value_start: float) -> list[float]:
    """The encoder features' RMS on env 0's frames of slot 0, before and after each update."""
    import torch

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.agents.batch import gather_batch

    torch.manual_seed(0)
    cfg = dataclasses.replace(cfg, center_values=variant == "center_values")
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    model = learner.model
    probe = torch.as_tensor(traj["obs"][0, :, 0])
    rng = np.random.default_rng(0)
    if variant == "no_value":
        learner.hp = dataclasses.replace(learner.hp, value_coeff=0.0)
    if variant == "value_at_mean":
        with torch.no_grad():
            _, values = model(probe)
            model.value_head.bias.add_(value_start - float(values.mean()))

    def rms() -> float:
        with torch.no_grad():
            return float(model.features(probe).pow(2).mean().sqrt())

    out = [rms()]
    for _ in range(updates):
        traj["versions"][:] = learner.version  # fresh: no sample is masked as too stale
        batch = gather_batch(traj, rng.choice(len(traj["obs"]), min(2, len(traj["obs"])), replace=False),
                             learner.version, torch.device("cpu"))
        learner.train(batch, 0)
        out.append(rms())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnn", default="lstm", help="none, gru or lstm (default: %(default)s)")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--envs", type=int, default=16, help="Pong envs a slot holds (default: %(default)s)")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--value-start", type=float, default=-2.0, help="value_at_mean's start (default: %(default)s)")
    args = parser.parse_args(argv)

    import torch

    from asyncrl.envs.registry import make_env_spec
    from asyncrl.resolve import config_from_flags

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as train_dir:
        cfg = config_from_flags(env="atari_pong", rnn=args.rnn, workers=1, envs_per_worker=args.envs,
                                worker_splits=1, rollout=32, batch_size=2 * args.envs * 32, device="cpu",
                                precision="fp32", train_dir=train_dir)
        spec = make_env_spec(cfg)
        traj = collect(cfg, spec, args.slots)
        print(f"{args.slots} slots, {int((traj['rewards'] != 0).sum())} nonzero rewards; encoder feature RMS on "
              f"one env's frames after each update (--rnn {args.rnn}):")
        for variant in args.variants:
            series = train(cfg, spec, traj, variant, args.updates, args.value_start)
            marks = sorted({0, *range(10, len(series), 10), len(series) - 1})
            print(f"  {variant:14s} " + "  ".join(f"{i}: {series[i]:.3g}" for i in marks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
