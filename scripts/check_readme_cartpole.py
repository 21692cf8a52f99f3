"""Check README's first claim: its CartPole command, run as written over seeds 0..9, reaches its stated figure.

README.md's "A first run" block holds one line of the form

    asyncrl-train --env CartPole-v1 --frames 300000   # the mean return reaches 475 (...)

This script reads that line from README.md (the command, and the figure after "reaches"), runs the command once
per seed with only `--seed N --train-dir DIR --experiment seed_N` added, and judges each run by its best
`episode_return_mean` (the mean return of the last 100 episodes) over the records of its metrics.jsonl: a seed
passes when some record reaches the figure. It prints one line per seed (best and final mean return, the env
steps at the first record at or above the figure, wall seconds), then the IQM of the final mean returns across
seeds (asyncrl-compare's statistics) and `asyncrl-compare`'s table, and exits 1 unless every seed passed.

    .venv/bin/python scripts/check_readme_cartpole.py                 # seeds 0..9: 7-8 min on 2 busy cores
    .venv/bin/python scripts/check_readme_cartpole.py --seeds 0 1     # fewer seeds
    .venv/bin/python scripts/check_readme_cartpole.py --print-command # the command read from README.md
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from asyncrl.diagnostics.compare import bootstrap_ci, iqm

ROOT = Path(__file__).resolve().parent.parent
CLAIM = re.compile(r"^(asyncrl-train --env CartPole-v1 [^#]*?)\s*#\s*the mean return reaches (\d+(?:\.\d+)?)")


def readme_claim(readme: Path = ROOT / "README.md") -> tuple[list[str], float]:
    """The CartPole command README.md shows (as argv) and the mean return it says the command reaches."""
    found = [m for line in readme.read_text().splitlines() if (m := CLAIM.match(line.strip()))]
    if len(found) != 1:
        raise SystemExit(f"README.md: expected one `asyncrl-train --env CartPole-v1 ... # the mean return reaches N` "
                         f"line, found {len(found)}")
    return shlex.split(found[0].group(1)), float(found[0].group(2))


def tool(name: str) -> str:
    """A console script beside this interpreter (the checkout's .venv/bin), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def records(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip().endswith("}")]


def run_seed(argv: list[str], seed: int, train_dir: Path, target: float) -> dict:
    cmd = [tool(argv[0]), *argv[1:], "--seed", str(seed), "--train-dir", str(train_dir),
           "--experiment", f"seed_{seed}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    recs = [r for r in records(train_dir / f"seed_{seed}" / "metrics.jsonl")
            if r.get("episode_return_mean") is not None]
    first = next((r for r in recs if r["episode_return_mean"] >= target), None)
    return {
        "seed": seed, "rc": proc.returncode, "wall_s": round(wall, 1),
        "best": max((r["episode_return_mean"] for r in recs), default=None),
        "final": recs[-1]["episode_return_mean"] if recs else None,
        "env_steps": recs[-1]["env_steps"] if recs else None,
        "steps_to_target": first["env_steps"] if first else None,
        "secs_to_target": round(first["time"], 1) if first else None,
        "error": proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--train-dir", type=Path, default=None,
                        help="keep the runs here (default: a temporary directory, removed at the end)")
    parser.add_argument("--print-command", action="store_true", help="print the command and figure, run nothing")
    args = parser.parse_args()
    argv, target = readme_claim()
    if args.print_command:
        print(shlex.join(argv), target)
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    print(f"README.md's command: {shlex.join(argv)}   (target: a mean return of {target:g}; commit {commit})")
    train_dir = args.train_dir or Path(tempfile.mkdtemp(prefix="asyncrl-readme-cartpole-"))
    try:
        results = []
        for seed in args.seeds:
            res = run_seed(argv, seed, train_dir, target)
            results.append(res)
            ok = res["rc"] == 0 and res["steps_to_target"] is not None
            reached = (f"reached {target:g} at {res['steps_to_target']:,} env steps ({res['secs_to_target']} s)"
                       if res["steps_to_target"] is not None else f"never reached {target:g}")
            print(f"seed {seed}: {'PASS' if ok else 'FAIL'}  best {res['best']}  final {res['final']}  {reached}; "
                  f"{res['env_steps']} env steps, {res['wall_s']} s wall, exit {res['rc']}"
                  + (f"  ({res['error']})" if res["error"] else ""), flush=True)
        finals = np.array([r["final"] for r in results if r["final"] is not None])
        if len(finals):
            ci = bootstrap_ci(finals)
            print(f"final mean return (each run's last record): IQM {float(iqm(finals)):.1f}"
                  + (f", 95% bootstrap CI [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
                  + f", mean {finals.mean():.1f}, min {finals.min():g} over {len(finals)} seeds")
        # asyncrl-compare's own table: its final score is the mean of each run's last 5 records, and a run this
        # short has 2 or 3 (one per --report-interval, 5 s, and the last), so it mixes in the mid-run record
        compare = subprocess.run([tool("asyncrl-compare"), str(train_dir), "--threshold", f"{target:g}"],
                                 capture_output=True, text=True)
        print("asyncrl-compare " + str(train_dir) + f" --threshold {target:g}:")
        print(compare.stdout.rstrip() or compare.stderr.rstrip())
        passed = sum(r["rc"] == 0 and r["steps_to_target"] is not None for r in results)
        print(f"{passed} of {len(results)} seeds reached {target:g}")
        return 0 if passed == len(results) else 1
    finally:
        if args.train_dir is None:
            shutil.rmtree(train_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
