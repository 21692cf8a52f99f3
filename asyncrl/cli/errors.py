"""The one-line error of a console script: `asyncrl-TOOL: error: MESSAGE` on stderr, and exit code 2."""

from __future__ import annotations

import sys


def fail(tool: str, message: str) -> int:
    """Print `asyncrl-<tool>: error: <message>` on stderr; returns 2, the exit code of a refused command."""
    print(f"asyncrl-{tool}: error: {message}", file=sys.stderr)
    return 2
