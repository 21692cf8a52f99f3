"""`make bench`'s Pong rows alone: atari_pong (ale_py's vector env) and envpool:Pong-v5 side by side, env_only,
sampler and train, each step in a fresh process exactly as the full suite runs it (`asyncrl/bench/suite.py`:
same settings, same windows), in one run. docs/results.md's EnvPool-against-ale_py figures.

    nice -n 19 .venv/bin/python scripts/envpool_pong_bench.py [--seconds 40] [--out bench/pong_envpool.json]

Prints the suite's throughput and ratio tables for these rows (with the load average in each record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from asyncrl.bench.report import ratio_table, throughput_table
from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.suite import ENVPOOL_ENV, ENVPOOL_MODES, add_ratios, plan, run_step

ENVS = ["atari_pong", ENVPOOL_ENV]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=0.0, help="per figure (0: the full suite's 40 s)")
    p.add_argument("--out", default=os.path.join("bench", "pong_envpool.json"))
    opts = p.parse_args()
    overrides = {"seconds": opts.seconds} if opts.seconds else None
    steps = [s for s in plan(ENVS, False, BenchSettings(), overrides=overrides)
             if s.settings.env in ENVS and s.settings.mode in ENVPOOL_MODES and not s.group and not s.scaling]
    records = [run_step(step) for step in steps]
    ratios = add_ratios(records)
    os.makedirs(os.path.dirname(opts.out) or ".", exist_ok=True)
    with open(opts.out, "w") as f:
        json.dump(records, f, indent=1)
    print("\n".join([*throughput_table(records), "", *ratio_table(ratios)]))
    for r in records:
        print(f"{r['env']} {r['mode']}: load average {r.get('machine', {}).get('load_avg')}")
    return 1 if any(r.get("error") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
