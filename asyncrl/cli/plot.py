"""`asyncrl-plot RUN_DIR...`: the learning curves of several runs on one PNG."""

from __future__ import annotations

import os

from asyncrl.cli.errors import OneLineParser, fail
from asyncrl.diagnostics.rundir import RunDirError, load_run

MIN_POINTS = 2  # records with the metric a run needs for a line


def labels(paths: list[str]) -> list[str]:
    """Each run's directory name, with its parent's where two runs share a name."""
    names = [os.path.basename(os.path.normpath(p)) for p in paths]
    return [n if names.count(n) == 1 else os.path.join(os.path.basename(os.path.dirname(os.path.normpath(p))), n)
            for n, p in zip(names, paths)]


def seeds_curve(run_dirs: list[str], out: str, levels: list[float]) -> int:
    from asyncrl.diagnostics.seed_curve import write_seed_curve

    try:
        print("\n".join(write_seed_curve(run_dirs, out, levels)))
    except RunDirError as exc:
        return fail("plot", str(exc))
    except OSError as exc:
        return fail("plot", f"cannot write {out}.csv and {out}.png ({exc.strerror})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="asyncrl-plot", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--x", choices=("frames", "time"), default="frames", help="x axis (default: frames)")
    parser.add_argument("--out", default="learning_curves.png", help="PNG to write (default: %(default)s)")
    parser.add_argument("--metric", default="episode_return_mean",
                        help="metrics.jsonl key to plot, e.g. an env metric info_<key> (default: %(default)s)")
    parser.add_argument("--seeds-curve", metavar="OUT",
                        help="the runs as seeds of one configuration: write OUT.csv and OUT.png (mean and min-max "
                             "of episode_return_mean over the runs, wall-clock on the top axis) instead of --out")
    parser.add_argument("--levels", type=float, nargs="+", default=[], metavar="R",
                        help="with --seeds-curve: print each run's frames and minutes to reach these returns")
    args = parser.parse_args(argv)
    if args.seeds_curve:
        return seeds_curve(args.run_dirs, args.seeds_curve, args.levels)
    try:
        runs = [load_run(p) for p in args.run_dirs]
    except RunDirError as exc:
        return fail("plot", str(exc))
    missing = [p for p, r in zip(args.run_dirs, runs) if not any(args.metric in rec for rec in r.records)]
    if missing:
        return fail("plot", f"{missing[0]} has no {args.metric!r} in metrics.jsonl; name a key it has")
    for path, run in zip(args.run_dirs, runs):
        points = sum(1 for rec in run.records if rec.get(args.metric) is not None)
        if points < MIN_POINTS:
            return fail("plot", f"{path} has {points} record{'' if points == 1 else 's'} with {args.metric!r}, too "
                                f"few for a curve (it needs {MIN_POINTS}): train longer, or with a shorter "
                                "--report-interval")
    from asyncrl.diagnostics.plots import compare_runs

    try:
        path = compare_runs(list(zip(labels(args.run_dirs), (r.records for r in runs))), args.x, args.out,
                            args.metric)
    except OSError as exc:
        return fail("plot", f"cannot write {args.out} ({exc.strerror})")
    print(path)
    return 0


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
