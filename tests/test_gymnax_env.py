"""gymnax's JAX envs: the adapter's checks (tests/gymnax_checks.py) in a fresh interpreter, and a run through
`asyncrl-train --env gymnax:<id>`.

JAX's runtime does not survive a fork, and pytest-xdist runs several test files in one process: importing JAX
here would break every later test of that process that forks the engine. So nothing in this process imports it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gymnax") is None, reason="the gymnax extra")


def test_the_adapter_checks_pass_in_a_fresh_interpreter() -> None:
    checks = Path(__file__).with_name("gymnax_checks.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(checks)],
                          capture_output=True, text=True, timeout=300, cwd=checks.parent.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_a_gymnax_env_trains_through_the_forked_engine(tmp_path: Path) -> None:
    proc = run_cli(["--env", "gymnax:CartPole-v1", "--workers", "1", "--envs-per-worker", "64", "--rollout", "16",
                    "--batch-size", "1024", "--minibatches", "4", "--epochs", "1", "--frames", "10000",
                    "--report-interval", "1"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "gymnax_CartPole-v1")
    assert records[-1]["env_steps"] >= 10000 and records[-1]["episode_return_mean"] is not None
    assert "jax" not in sys.modules
