"""Eager against --compile on one asyncrl-bench row, alternating runs (A B A B ...) on the same machine.

    .venv/bin/python scripts/compile_ab.py --rounds 3 --compile "--compile all" -- \
        --mode train --env CartPole-v1 --workers 2 --envs-per-worker 2048 --rollout 16 --batch-size 65536 \
        --minibatches 4 --seconds 20 --repeats 4

Each run is one `asyncrl-bench --mode ...` record (the median of its windows); the table gives, for eager and
compiled, the median over the rounds of those medians, every run's figure, the median first-frames time after
launch, and the 1-minute load average around each run (the machine is shared: read the ratio with it).
Extra flags for both arms go after `--extra`, e.g. `--extra "--learner-threads 2"`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys


def bench(args: list[str], train_flags: list[str]) -> dict:
    cmd = [sys.executable, "-m", "asyncrl.cli.bench", *args, *(["--", *train_flags] if train_flags else [])]
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        sys.exit(f"compile_ab: {shlex.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    record = json.loads(lines[-1])
    record["load_before"], record["load_after"] = load, os.getloadavg()[0]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", default="--compile all", help="the compiled arm's asyncrl-train flags")
    parser.add_argument("--extra", default="", help="asyncrl-train flags for both arms")
    parser.add_argument("--out", default="", help="write every record here (JSON list)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="asyncrl-bench arguments, after --")
    a = parser.parse_args()
    bench_args = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    arms = {"eager": shlex.split(a.extra), "compiled": shlex.split(a.extra) + shlex.split(a.compile)}
    records: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(a.rounds):
        for name, flags in (arms.items() if r % 2 == 0 else reversed(list(arms.items()))):
            rec = bench(bench_args, flags)
            records[name].append(rec)
            print(f"round {r + 1} {name}: {rec['sps']:,.0f} agent steps/s, first frames {rec.get('startup_s')} s, "
                  f"compile {rec.get('compile_s') or '-'} s, "
                  f"load {rec['load_before']:.1f}-{rec['load_after']:.1f}", flush=True)
    med = {name: statistics.median(x["sps"] for x in recs) for name, recs in records.items()}
    for name, recs in records.items():
        starts = [x["startup_s"] for x in recs if x.get("startup_s") is not None]
        loads = [x["load_before"] for x in recs] + [x["load_after"] for x in recs]
        runs = ", ".join(f"{x['sps']:,.0f}" for x in recs)
        print(f"| {name} | {med[name]:,.0f} | {runs} | "
              f"{statistics.median(starts) if starts else '-'} | {min(loads):.1f}-{max(loads):.1f} |")
    print(f"compiled / eager = {med['compiled'] / med['eager']:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
