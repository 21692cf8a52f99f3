"""Compare two settings over seeds: train each (lr 1e-3 and 3e-4 on CartPole) with several seeds, then
asyncrl-compare's IQM, bootstrap CI, probability of improvement and frames to a threshold.

    .venv/bin/python examples/compare_seeds.py                          # 2 x 3 runs of 150k env steps
    .venv/bin/python examples/compare_seeds.py --frames 4000 --seeds 0  # a smoke run (every env ends an episode)

Runs go to RUNS/lr-<value>/seed<S> (one directory of seeds per setting, as asyncrl-compare reads them).
asyncrl-sweep (docs/tools.md) does the same from a file, several runs at a time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=150_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-4])
    parser.add_argument("--runs", default="runs/compare", help="where the groups are written")
    parser.add_argument("--threshold", type=float, default=475.0, help="report frames to this mean return")
    args = parser.parse_args()

    import asyncrl

    groups = []
    for lr in args.lrs:
        group = os.path.join(args.runs, f"lr-{lr:g}")
        for seed in args.seeds:  # one run after another in this process: no torch work in between
            asyncrl.train(env="CartPole-v1", lr=lr, seed=seed, frames=args.frames, train_dir=group,
                          experiment=f"seed{seed}", report_interval=1.0)
        groups.append(group)
    compare = os.path.join(os.path.dirname(sys.executable), "asyncrl-compare")
    subprocess.run([compare, *groups, "--threshold", str(args.threshold), "--out", os.path.join(args.runs, "summary")],
                   check=True)


if __name__ == "__main__":
    main()
