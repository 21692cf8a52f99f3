"""`asyncrl-sweep FILE`: run a grid of settings x seeds, or search ranges of settings with Optuna, each point
an asyncrl-train run, K at a time."""

from __future__ import annotations

import argparse
import os
import sys

from asyncrl.cli.errors import OneLineParser
from asyncrl.cli.train import main as train_main
from asyncrl.sweep import SweepError, cores_per_run, parse_sweep, plan, read_sweep_file, run_all


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="asyncrl-sweep", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("file", metavar="FILE", help="YAML or JSON: {base: {...}, grid: {flag: [values]}, "
                                                     "seeds: [...], group: NAME}; a search has search: {flag: "
                                                     "range}, objective, trials (docs/sweeps.md)")
    parser.add_argument("--concurrent", type=int, default=1, metavar="K",
                        help="runs at once (a search: K // seeds trials, each with its seeds side by side); each "
                             "gets --workers and --learner-threads of cores // K unless the file sets them "
                             "(default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.concurrent < 1:
            raise SweepError("--concurrent must be at least 1")
        data, default_group = read_sweep_file(args.file)
        if isinstance(data, dict) and "search" in data:
            return _search(data, default_group, args)
        sweep = parse_sweep(data, default_group)
        plans = plan(sweep, args.concurrent)
        existing = [p.run_dir for p in plans if os.path.exists(p.run_dir)]
        if existing and not args.dry_run:
            raise SweepError(f"{existing[0]} already exists ({len(existing)} of the sweep's run directories do); "
                             f"remove them or give the sweep another group")
    except SweepError as exc:
        print(f"asyncrl-sweep: error: {exc}", file=sys.stderr)
        return 2
    group_dir = os.path.join(sweep.train_dir, sweep.group)
    share = cores_per_run(args.concurrent)
    print(f"asyncrl-sweep: {len(plans)} runs ({len(plans) // len(sweep.seeds)} settings x {len(sweep.seeds)} "
          f"seeds) into {group_dir}, {args.concurrent} at once, {share} core(s) each", flush=True)
    if args.dry_run:
        for p in plans:
            print(p.command())
        return 0
    failed = run_all(plans, args.concurrent, train_main)
    print(f"asyncrl-sweep: {len(plans) - len(failed)} of {len(plans)} runs finished"
          + (f", {len(failed)} failed: {', '.join(p.name for p in failed)}" if failed else "")
          + f"; compare them with: asyncrl-compare {os.path.join(group_dir, '*')}", flush=True)
    return 1 if failed else 0


def _search(data: dict, default_group: str, args: argparse.Namespace) -> int:
    """The search mode; bad input (SweepError) is raised before anything starts."""
    from asyncrl.search.command import check_start, run_search
    from asyncrl.search.spec import parse_search
    from asyncrl.search.study import require_optuna

    spec = parse_search(data, default_group)
    require_optuna()
    check_start(spec)
    return run_search(spec, args.concurrent, args.dry_run, train_main)


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
