"""`asyncrl-train`'s `main(argv)` in this process, and the check that bad input is one line on stderr with exit
code 2 (tests/test_cli.py and the other tests of what a user types)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrl.cli import train

# Settings that would start quickly if they were valid; each test breaks exactly one thing.
FAST = ["--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "2", "--rollout", "8", "--batch-size", "16",
        "--minibatches", "1", "--seconds", "5"]


@dataclass
class Result:
    """What a command left: its exit code and its output (as `subprocess.CompletedProcess` has them)."""

    returncode: int
    stdout: str
    stderr: str


def main_in_process(args: list[str], train_dir: Path, capsys: pytest.CaptureFixture[str]) -> Result:
    """`asyncrl-train ARGS --train-dir TRAIN_DIR` as `main(argv)` here; argparse's exits become the exit code."""
    capsys.readouterr()  # start from empty captures
    try:
        code = train.main([*args, "--train-dir", str(train_dir)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def assert_user_error(result: subprocess.CompletedProcess[str] | Result, *fragments: str) -> str:
    """Exit code 2 and exactly one line on stderr, with every fragment in it and no traceback."""
    assert result.returncode == 2, f"exit code {result.returncode}; stderr:\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]
