"""`asyncrl-diagnose RUN_DIR`: write RUN_DIR/diagnosis.md (with figures) for a finished or running run."""

from __future__ import annotations

import argparse

from asyncrl.cli.errors import fail
from asyncrl.diagnostics.rundir import RunDirError, load_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl-diagnose", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("run_dir", help="the run's directory (TRAIN_DIR/EXPERIMENT)")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
