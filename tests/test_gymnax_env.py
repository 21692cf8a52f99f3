"""gymnax's JAX envs: the adapter's checks (tests/gymnax_checks.py) in a fresh interpreter, and a run through
`asyncrl-train --env gymnax:<id>`.

JAX's runtime does not survive a fork, and pytest-xdist runs several test files in one process: importing JAX
here would break every later test of that process that forks the engine. So nothing in this process imports it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gymnax") is None, reason="the gymnax extra")

# Every env size and layout is an XLA program of its own, compiled on first use: about half of these tests' CPU
# time. Unoptimised CPU code compiles in half the time (7.0-7.7 s -> 3.6-3.9 s of CPU for CartPole's and Breakout's
# reset and step) and steps the same envs: over 300 random steps Breakout's observations and both envs' rewards and
# episode ends were identical, CartPole's observations within 2e-5 (float32 rounding). What is checked here is the
# adapter, not XLA's optimiser.
XLA_FLAGS = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))


def test_the_adapter_checks_pass_in_a_fresh_interpreter() -> None:
    checks = Path(__file__).with_name("gymnax_checks.py")
    # --noconftest: the checks use no fixture of tests/conftest.py, whose imports (torch) would be half the time
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", str(checks)],
                          capture_output=True, text=True, timeout=300, cwd=checks.parent.parent,
                          env={**os.environ, "XLA_FLAGS": XLA_FLAGS})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_a_gymnax_env_trains_through_the_forked_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run also fills asyncrl's cache: the env's spaces (read back here with no process started) and the
    workers' compiled reset and step."""
    import gymnasium as gym

    from asyncrl.envs import fresh_process, gymnax_env

    monkeypatch.setenv("XLA_FLAGS", XLA_FLAGS)  # for the rollout worker's env
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path / "cache"))
    proc = run_cli(["--env", "gymnax:CartPole-v1", "--workers", "1", "--envs-per-worker", "64", "--rollout", "16",
                    "--batch-size", "1024", "--minibatches", "4", "--epochs", "1", "--frames", "10000",
                    "--report-interval", "1"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "gymnax_CartPole-v1")
    assert records[-1]["env_steps"] >= 10000 and records[-1]["episode_return_mean"] is not None
    assert [p.name for p in (tmp_path / "cache" / "jax").iterdir() if p.name.startswith("jit_step")]

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("the spaces were described again")

    monkeypatch.setattr(fresh_process.subprocess, "run", no_process)  # where the spaces are described
    obs, act = gymnax_env.gymnax_spaces("CartPole-v1", channels_first=True)
    assert obs.shape == (4,) and act == gym.spaces.Discrete(2)
    [entry] = (tmp_path / "cache" / "gymnax-spaces").iterdir()
    entry.write_bytes(b"damaged")  # a damaged entry is described again, never trusted
    assert gymnax_env._read_spaces(str(entry)) is None
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", "off")
    assert gymnax_env._spaces_cache_path("CartPole-v1", True, {}) is None
    assert "jax" not in sys.modules
