"""`asyncrl-export RUN_DIR --format torchscript|onnx --out FILE`: the trained policy as a standalone model file."""

from __future__ import annotations

import argparse
import os
import sys

from asyncrl.cli.errors import OneLineParser, fail
from asyncrl.system import install_hint


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="asyncrl-export", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (TRAIN_DIR/EXPERIMENT)")
    parser.add_argument("--format", required=True, choices=("torchscript", "onnx"), help="file format")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the model file; FILE's stem + .json (how to use it) and + .safetensors (weights) "
                             "are written beside it")
    parser.add_argument("--best", action="store_true", help="export checkpoints/best.pt (the best evaluation of a "
                                                            "run trained with --eval-every), not the newest "
                                                            "checkpoint")
    parser.add_argument("--policy", type=int, default=0, help="which policy of a --num-policies run to export "
                        "(default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from asyncrl.export import ExportError, export_policy
    except ImportError as exc:
        return fail("export", f"{exc}; install the export extra ({install_hint('export')})")
    parent = os.path.dirname(os.path.abspath(args.out))
    created = missing_dir(parent)
    try:
        paths = export_policy(args.run_dir, args.format, args.out, args.best, args.policy)
    except ExportError as exc:
        return fail("export", str(exc))
    except ImportError as exc:
        return fail("export", f"{exc}; install the export extra ({install_hint('export')})")
    except OSError as exc:
        return fail("export", f"cannot write {args.out} ({exc.strerror or exc})")
    if created is not None and os.path.isdir(parent):
        print(f"asyncrl-export: created the directory {created} for --out", file=sys.stderr)
    for path in paths.values():
        print(path)
    return 0


def missing_dir(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (what writing there creates), or None."""
    missing = None
    while path and not os.path.isdir(path):
        missing, path = path, os.path.dirname(path)
        if path == missing:
            break
    return missing


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
