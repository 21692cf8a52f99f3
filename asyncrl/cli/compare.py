"""`asyncrl-compare GROUP GROUP...`: compare groups of runs (seeds) by final score, with confidence and tests."""

from __future__ import annotations

import argparse
import json
import os

from asyncrl.cli.errors import OneLineParser, fail
from asyncrl.diagnostics.rundir import RunDirError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="asyncrl-compare", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("groups", nargs="+", metavar="GROUP", help="a directory of run directories (one per seed)")
    parser.add_argument("--metric", help="metrics.jsonl key to compare (default: episode_return_mean; with --window "
                        "episode_return_window)")
    parser.add_argument("--window", type=int, metavar="STEPS",
                        help="compare episode_return_window: the mean return of the episodes that ended within the "
                             "last STEPS env steps, recovered from the running means (runs' first 100 episodes)")
    parser.add_argument("--threshold", type=float, help="also report each run's frames to reach this metric value")
    parser.add_argument("--at-frames", type=float, metavar="F",
                        help="compare every run as it stood at F frames (runs of different lengths; each must reach F)")
    parser.add_argument("--out", metavar="DIR", help="write summary.json and curves.png to DIR")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from asyncrl.diagnostics import compare
    from asyncrl.diagnostics.windowed import METRIC

    if args.window is not None and args.window < 1:
        return fail("compare", f"--window {args.window}: give a positive number of env steps")
    if args.window is not None and args.metric not in (None, METRIC):
        return fail("compare", f"--window compares {METRIC}; drop --metric {args.metric}")
    args.metric = args.metric or (METRIC if args.window is not None else "episode_return_mean")
    try:
        labels = compare.group_labels(args.groups)
        groups = [compare.load_group(p, args.metric, label, args.at_frames, args.window)
                  for p, label in zip(args.groups, labels)]
        if args.out:
            os.makedirs(args.out, exist_ok=True)
    except RunDirError as exc:
        return fail("compare", str(exc))
    except OSError as exc:
        return fail("compare", f"cannot create {args.out} ({exc.strerror}); pass a writable --out")
    summary = compare.summarize(groups, args.threshold, args.at_frames)
    summary["metric"] = args.metric
    print(compare.format_table(summary))
    if args.out:
        try:
            png = compare.plot_curves(groups, args.metric, os.path.join(args.out, "curves.png"))
            path = os.path.join(args.out, "summary.json")
            with open(path, "w") as f:
                json.dump(summary, f, indent=2, allow_nan=False)
        except OSError as exc:
            return fail("compare", f"cannot write to {args.out} ({exc.strerror})")
        print(f"\n{path}\n{png}")
    return 0


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
