"""`asyncrl-diagnose RUN_DIR`: write RUN_DIR/diagnosis.md (with figures) for a finished or running run; with
--shots, where a Doom policy's points go; with --core-state, inside a recurrent policy's encoder and core."""

from __future__ import annotations

import argparse

from asyncrl.cli.errors import OneLineParser, fail
from asyncrl.diagnostics.rundir import RunDirError, load_run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="asyncrl-diagnose", description=" ".join(__doc__.split(":", 1)[1].split()))
    parser.add_argument("run_dir", help="the run's directory (TRAIN_DIR/EXPERIMENT)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--shots", action="store_true",
                      help="a doom_* run: play its latest policy and count shots, kills, misses and deaths per "
                           "episode (a miss: a shot no kill follows within its step or the next), split by "
                           "tapped and held trigger")
    mode.add_argument("--core-state", action="store_true",
                      help="a --rnn gru|lstm run: play one episode and print the encoder features' RMS and spread, "
                           "the LSTM cells beyond |c| > 10, and the value's mean and std")
    parser.add_argument("--episodes", type=int, help="--shots: episodes to play (default: 20)")
    parser.add_argument("--greedy", action="store_true", help="--shots: the most likely action instead of sampling")
    parser.add_argument("--steps", type=int, help="--core-state: at most this many steps (default: 600)")
    parser.add_argument("--seed", type=int, help="--shots or --core-state: env seed (default: 12345, asyncrl-enjoy's, "
                                                 "for --shots; 1 for --core-state)")
    return parser.parse_args(argv)


def refused(args: argparse.Namespace) -> str | None:
    """Why these flags do not go together, or None."""
    for flag, given, mode in (("--episodes", args.episodes is not None, args.shots),
                              ("--greedy", args.greedy, args.shots),
                              ("--steps", args.steps is not None, args.core_state),
                              ("--seed", args.seed is not None, args.shots or args.core_state)):
        if given and not mode:
            owner = {"--seed": "--shots or --core-state", "--steps": "--core-state"}.get(flag, "--shots")
            return f"{flag} goes with {owner}"
    for flag, value in (("--episodes", args.episodes), ("--steps", args.steps)):
        if value is not None and value < 1:
            return f"{flag} must be at least 1"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = refused(args)
    if problem:
        return fail("diagnose", problem)
    if args.shots or args.core_state:
        return look_inside(args)
    try:
        run = load_run(args.run_dir)
    except RunDirError as exc:
        return fail("diagnose", str(exc))
    from asyncrl.diagnostics.report import write_report

    try:
        print(write_report(run))
    except OSError as exc:
        return fail("diagnose", f"cannot write the report in {args.run_dir} ({exc.strerror})")
    return 0


def look_inside(args: argparse.Namespace) -> int:
    """--shots or --core-state: play the run's policy and print what it did."""
    from asyncrl.envs.base import EnvError

    try:
        if args.shots:
            from asyncrl.cli.doom_shots import SEED, doom_shots

            doom_shots(args.run_dir, 20 if args.episodes is None else args.episodes, args.greedy,
                       SEED if args.seed is None else args.seed)
        else:
            from asyncrl.cli.core_state import SEED, core_state

            core_state(args.run_dir, 600 if args.steps is None else args.steps,
                       SEED if args.seed is None else args.seed)
    except (RunDirError, EnvError) as exc:
        return fail("diagnose", str(exc))
    return 0


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
