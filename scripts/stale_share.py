"""The share of sampled env steps the learner drops as too stale (`--max-policy-lag`), for every train row of
`make bench`'s suite and the 4,096-env CartPole VectorEnv run of the defaults (`--workers 2 --envs-per-worker
2048`), each an `asyncrl-train` run of `--seconds`.

    python scripts/stale_share.py --seconds 40                    # this checkout
    python scripts/stale_share.py --seconds 40 --tree /tmp/old    # another checkout's asyncrl (a git worktree)

`--tree` runs the trainer from that checkout (PYTHONPATH), for a before/after table; the rows and their flags are
this checkout's. The first two records (start-up, warm-up) are left out. Prints one markdown row per run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.suite import plan, suite_envs

# The run: the defaults at 2 workers x 2,048 VectorEnv CartPoles. Before --batch-size was derived, the
# run needed one given: 16,384 (one trajectory of the 1,024 envs of a split x 16 steps), what it is derived as now.
VECTOR_4096 = ["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2048", "--batch-size", "16384"]


def rows(seconds: float) -> list[tuple[str, list[str]]]:
    """(label, asyncrl-train flags) of each train row of the full suite, then the 4,096-env run."""
    out = []
    envs, _ = suite_envs(None)
    for step in plan(envs, quick=False, base=BenchSettings()):
        s = step.settings
        if s.mode != "train":
            continue
        label = f"{s.env} {s.workers} x {s.envs_per_worker}" + (f" ({step.label})" if step.label else "")
        out.append((label, list(s.trainer_args())))
    out.append(("CartPole-v1 2 x 2048, defaults", VECTOR_4096))
    return out


def stale_share(flags: list[str], seconds: float, tree: str | None) -> tuple[int, int]:
    """(dropped, sampled) env steps after the first two records of a `seconds` run."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-stale-") as train_dir:
        env = {**os.environ, **({"PYTHONPATH": tree} if tree else {})}
        cmd = [sys.executable, "-m", "asyncrl.cli.train", *flags, "--seconds", str(seconds), "--report-interval",
               "5", "--train-dir", train_dir, "--experiment", "stale", "--checkpoint-interval", "1e9"]
        subprocess.run(cmd, env=env, cwd=tree or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False, timeout=seconds + 600)
        metrics = Path(train_dir, "stale", "metrics.jsonl")
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    records = [r for r in records if "env_steps" in r][2:]
    if len(records) < 2:
        return 0, 0
    sampled = records[-1]["env_steps"] - records[0]["env_steps"]
    return sum(r.get("dropped_stale", 0) for r in records[1:]), sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--tree", default=None, help="a checkout whose asyncrl runs the trainer (default: this one)")
    parser.add_argument("--only", default="", help="run only the rows whose label contains this text")
    args = parser.parse_args()
    print("| row | dropped as stale | env steps sampled |\n|---|---:|---:|")
    for label, flags in rows(args.seconds):
        if args.only and args.only not in label:
            continue
        dropped, sampled = stale_share(flags, args.seconds, args.tree)
        share = f"{100 * dropped / sampled:.1f}%" if sampled else "no records"
        print(f"| {label} | {share} | {sampled:,} |", flush=True)


if __name__ == "__main__":
    main()
