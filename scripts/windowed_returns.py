#!/usr/bin/env python3
"""Copy runs' metrics.jsonl with `episode_return_window`: the mean return of the episodes that ended within the
last WINDOW env steps, recovered exactly from the running means the runner records.

    python scripts/windowed_returns.py --window 1000 --out derived runs/redq_pendulum runs/sac_pendulum
    asyncrl-compare derived/redq_pendulum derived/sac_pendulum --metric episode_return_window --threshold -200

Why: `episode_return_mean_20` (the last 20 episodes) lags by 20 episodes, about 4,000 env steps on Pendulum
whatever the env count, so it cannot show where a shorter run got; a window in env steps shows the level a run
has reached. While a run has
finished at most 100 episodes, `episode_return_mean` (the last 100) times `episodes` is the sum of every return
so far, so the returns that each record adds are known exactly (per record, not per episode). Records after the
100th episode carry no derived value; the script says how many runs were cut there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HISTORY = 100  # episode_return_mean's window (asyncrl/diagnostics/aggregate.py keeps the last 100 returns)


def windowed(records: list[dict], window: int) -> tuple[list[dict], bool]:
    """The records with `episode_return_window` added, and whether the run passed HISTORY episodes."""
    groups: list[tuple[int, float, int]] = []  # (env_steps, sum of the returns added, episodes added)
    prev_sum, prev_n, cut = 0.0, 0, False
    out = []
    for rec in records:
        rec = dict(rec)
        n, mean = rec.get("episodes") or 0, rec.get("episode_return_mean")
        if n > HISTORY:
            cut = True
        elif n > prev_n and mean is not None:
            total = n * mean
            groups.append((rec["env_steps"], total - prev_sum, n - prev_n))
            prev_sum, prev_n = total, n
        if not cut:
            recent = [(s, k) for steps, s, k in groups if steps > rec["env_steps"] - window]
            count = sum(k for _, k in recent)
            rec["episode_return_window"] = sum(s for s, _ in recent) / count if count else None
        out.append(rec)
    return out, cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", help="directories of run directories (as for asyncrl-compare)")
    parser.add_argument("--window", type=int, default=1000, help="env steps the mean looks back over")
    parser.add_argument("--out", required=True, help="directory for the derived copies (GROUP/RUN/metrics.jsonl)")
    args = parser.parse_args()
    for group in args.groups:
        if not os.path.isdir(group):
            sys.exit(f"windowed_returns: no directory {group}")
        for name in sorted(os.listdir(group)):
            src = os.path.join(group, name, "metrics.jsonl")
            if not os.path.isfile(src):
                continue
            with open(src) as f:
                records = [json.loads(line) for line in f if line.strip()]
            derived, cut = windowed(records, args.window)
            dst = os.path.join(args.out, os.path.basename(os.path.normpath(group)), name)
            os.makedirs(dst, exist_ok=True)
            with open(os.path.join(dst, "metrics.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in derived)
            if os.path.isfile(os.path.join(group, name, "config.json")):
                shutil.copy(os.path.join(group, name, "config.json"), dst)
            note = f" (cut after {HISTORY} episodes)" if cut else ""
            print(f"{dst}: {len(derived)} records{note}")


if __name__ == "__main__":
    main()
