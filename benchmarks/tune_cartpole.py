"""Measure how fast `asyncrl-train --env CartPole-v1` learns with given flags, over a few seeds.

Each run stops as soon as the mean return (last 100 episodes) reaches --target, or at --max-steps env steps.
Figures come from the run's metrics.jsonl: env steps and seconds (since the runner started) at the first
record at or above 450 and at or above --target.

    .venv/bin/python benchmarks/tune_cartpole.py --seeds 0 1 2 -- --epochs 4 --minibatches 4 --lr 1e-3
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [sys.executable, "-m", "asyncrl.cli.train"]  # honours PYTHONPATH, e.g. a snapshot of the package


def first_reaching(records: list[dict], threshold: float) -> dict | None:
    for rec in records:
        ret = rec.get("episode_return_mean")
        if ret is not None and ret >= threshold:
            return rec
    return None


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


def run_once(flags: list[str], seed: int, target: float, max_steps: int, max_seconds: float) -> dict:
    """One training run in a temporary train dir; interrupted once `target` is reached."""
    tmp = tempfile.mkdtemp(prefix="asyncrl-tune-")
    try:
        cmd = [*TRAIN, "--env", "CartPole-v1", "--train-dir", tmp, "--experiment", "run", "--seed", str(seed),
               "--frames", str(max_steps), "--seconds", str(max_seconds), "--report-interval", "1",
               "--checkpoint-interval", "1000", *flags]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        metrics = Path(tmp, "run", "metrics.jsonl")
        t0 = time.monotonic()
        while proc.poll() is None:
            if first_reaching(read_records(metrics), target) is not None:
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.25)
        _, err = proc.communicate(timeout=60)
        wall = time.monotonic() - t0
        records = read_records(metrics)
        out: dict = {"seed": seed, "rc": proc.returncode, "wall_s": round(wall, 1)}
        if proc.returncode:
            out["stderr"] = err.strip().splitlines()[-1:] if err else []
        for threshold, key in ((450.0, "450"), (target, "target")):
            rec = first_reaching(records, threshold)
            out[f"steps_{key}"] = rec["env_steps"] if rec else None
            out[f"secs_{key}"] = rec["time"] if rec else None
        out["best"] = max((r["episode_return_mean"] or 0.0 for r in records), default=None)
        out["final_steps"] = records[-1]["env_steps"] if records else 0
        out["dropped_stale"] = records[-1]["dropped_stale"] if records else 0
        out["lag_max"] = max((r["policy_lag_max"] for r in records if r.get("policy_lag_max") is not None),
                             default=None)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="asyncrl-train flags, after --")
    args = parser.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    print("flags:", " ".join(flags), flush=True)
    for seed in args.seeds:
        print(json.dumps(run_once(flags, seed, args.target, args.max_steps, args.max_seconds)), flush=True)


if __name__ == "__main__":
    main()
