"""The one-line error of a console script: `asyncrl-TOOL: error: MESSAGE` on stderr, and exit code 2; and the
argument parser of every tool but asyncrl-train (asyncrl/resolve.py has its own), whose usage errors are one line
too rather than argparse's usage block."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def fail(tool: str, message: str) -> int:
    """Print `asyncrl-<tool>: error: <message>` on stderr; returns 2, the exit code of a refused command."""
    print(f"asyncrl-{tool}: error: {message}", file=sys.stderr)
    return 2


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are `PROG: error: MESSAGE (see --help)` on one line, exit code 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
