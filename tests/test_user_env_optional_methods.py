"""A user's env need not have the optional methods of its API: a multi-agent env written without `close()` (the
PettingZoo ParallelEnv API's other methods present, or Sample Factory's list API) trains through `asyncrl-train`
like any other, with no traceback.

The envs are in tests/no_close_envs.py, named as `--env tests.no_close_envs:<callable>`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.diagnostics.metrics import read_metrics
from tests.conftest import run_cli
from tests.no_close_envs import EPISODE


@pytest.mark.parametrize("callable_name", ["parallel_without_close", "list_without_close"])
def test_a_multi_agent_env_without_close_trains(callable_name: str, tmp_path: Path) -> None:
    proc = run_cli(["--env", f"tests.no_close_envs:{callable_name}", "--workers", "1",
                    "--envs-per-worker", "4", "--worker-splits", "1", "--rollout", "8", "--batch-size", "32",
                    "--minibatches", "1", "--frames", "1600", "--report-interval", "1", "--experiment", "noclose"],
                   tmp_path, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output and "AttributeError" not in output, output[-3000:]
    records = read_metrics(tmp_path / "noclose")
    assert records and records[-1]["env_steps"] >= 1600
    returns = [r["episode_return_mean"] for r in records if r.get("episode_return_mean") is not None]
    assert returns and all(0.0 <= r <= EPISODE for r in returns), returns
