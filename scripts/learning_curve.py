#!/usr/bin/env python3
"""Train ENV for FRAMES over several seeds (or read finished runs) and write a learning-curve CSV and PNG.

    python scripts/learning_curve.py --env atari_pong --frames 10000000 --seeds 0 1 2 --out docs/pong
    python scripts/learning_curve.py --runs train_dir/pong_seed0 train_dir/pong_seed1 --out docs/pong

The x axis is emulator frames (agent steps x frameskip); returns are raw whole-episode scores (the
`episode_return_mean` of metrics.jsonl: the mean over the last 100 finished episodes). The CSV also has the
wall-clock seconds at each point, so frames and time can both be read off.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys

import numpy as np


def read_run(run_dir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frames, episode_return_mean, time) of one run, skipping records before the first episode."""
    frames, returns, times = [], [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("episode_return_mean") is not None:
                frames.append(rec["frames"])
                returns.append(rec["episode_return_mean"])
                times.append(rec["time"])
    if not frames:
        raise SystemExit(f"learning_curve: {run_dir} has no finished episodes yet")
    return np.asarray(frames, float), np.asarray(returns, float), np.asarray(times, float)


def first_crossing(frames: np.ndarray, returns: np.ndarray, times: np.ndarray, level: float):
    hit = np.nonzero(returns >= level)[0]
    return (int(frames[hit[0]]), float(times[hit[0]])) if len(hit) else (None, None)


def train(env: str, frames: int, seed: int, train_dir: str, extra: list[str]) -> str:
    name = f"{env.replace(':', '_')}_seed{seed}"
    cmd = [sys.executable, "-m", "asyncrl.cli.train", "--env", env, "--frames", str(frames), "--seed", str(seed),
           "--train-dir", train_dir, "--experiment", name, *extra]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return os.path.join(train_dir, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="atari_pong")
    parser.add_argument("--frames", type=int, default=10_000_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--train-dir", default="train_dir/curves")
    parser.add_argument("--runs", nargs="+", help="read these finished runs instead of training")
    parser.add_argument("--levels", type=float, nargs="+", default=[18.0, 20.0], help="report frames to reach these")
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.csv and OUT.png")
    args, extra = parser.parse_known_args()

    runs = args.runs or [train(args.env, args.frames, s, args.train_dir, extra) for s in args.seeds]
    curves = [read_run(r) for r in runs]
    end = min(c[0][-1] for c in curves)
    grid = np.linspace(min(c[0][0] for c in curves), end, 200)
    ret = np.stack([np.interp(grid, f, r) for f, r, _ in curves])
    wall = np.stack([np.interp(grid, f, t) for f, _, t in curves])

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["frames", "return_mean", "return_min", "return_max", "wall_seconds_mean",
                    *[f"return_{r.strip('/').replace('/', '_')}" for r in runs]])
        for i, x in enumerate(grid):
            w.writerow([int(x), ret[:, i].mean(), ret[:, i].min(), ret[:, i].max(), wall[:, i].mean(), *ret[:, i]])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(grid, ret.mean(0), label=f"mean of {len(runs)} run(s)")
    if len(runs) > 1:
        ax.fill_between(grid, ret.min(0), ret.max(0), alpha=0.25, label="min-max across seeds")
    ax.set_xlabel("emulator frames (agent steps x frameskip)")
    ax.set_ylabel("raw episode return (mean of last 100 episodes)")
    top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, grid, wall.mean(0)) / 60,
                                               lambda m: np.interp(m * 60, wall.mean(0), grid)))
    top.set_xlabel("wall-clock minutes")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)

    for run, (f, r, t) in zip(runs, curves):
        final = r[-1]
        marks = ", ".join(
            f"{lvl:+g}: " + ("not reached" if fr is None else f"{fr:,} frames, {tm / 60:.1f} min")
            for lvl in args.levels for fr, tm in [first_crossing(f, r, t, lvl)])
        print(f"{run}: {int(f[-1]):,} frames in {t[-1] / 60:.1f} min, final return {final:.2f}; {marks}")
    print(f"wrote {args.out}.csv and {args.out}.png")


if __name__ == "__main__":
    main()
