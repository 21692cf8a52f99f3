"""The health warnings of finished runs, launch by launch, as `asyncrl-diagnose` judges them: for each run
directory, each launch's warning codes (the first of each kind), then the totals over all launches.

    .venv/bin/python scripts/health_replay.py runs/pong_probe/*/

Run it from a checkout of another commit to compare its detectors with these on the same records.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from asyncrl.diagnostics.health import detect_over_run, launches
from asyncrl.diagnostics.rundir import RunDirError, load_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories (each with a metrics.jsonl)")
    args = parser.parse_args(argv)
    total: Counter[str] = Counter()
    count = 0
    for path in args.runs:
        try:
            records = load_run(path).records
        except RunDirError as e:
            print(f"health_replay: {e}", file=sys.stderr)
            return 2
        for i, launch in enumerate(launches(records)):
            codes = sorted(detect_over_run(launch))
            total.update(codes)
            count += 1
            print(f"{path} launch {i + 1} ({len(launch)} records): {', '.join(codes) or 'none'}")
    print(f"{count} launches, {sum(total.values())} warnings: "
          + (", ".join(f"{c} {n}" for c, n in total.most_common()) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
