"""`--resume` continues the same experiment: the saved config.json, not the presets, fills in what is not given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import asyncrl
from tests.conftest import run_cli
from tests.train_cli import assert_user_error

# Values unlike both the defaults and the vector preset, so a preset or a default taking over shows.
FIRST = ["--env", "CartPole-v1", "--experiment", "r", "--workers", "1", "--envs-per-worker", "2", "--rollout", "8",
         "--batch-size", "16", "--minibatches", "1", "--epochs", "2", "--lr", "0.0005", "--gamma", "0.95",
         "--value-coeff", "0.3", "--hidden-size", "48", "--activation", "relu", "--seed", "7", "--frames", "1500"]


def saved_config(train_dir: Path) -> dict:
    return json.loads((train_dir / "r" / "config.json").read_text())


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The train dir of one finished FIRST run; each test resumes (or tries to) a copy of it."""
    train_dir = tmp_path_factory.mktemp("first")
    first = run_cli(FIRST, train_dir, timeout=180)
    assert first.returncode == 0, first.stderr
    return train_dir


def copy_of(first_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(first_run / "r", tmp_path / "r")
    return tmp_path


def test_resume_keeps_saved_settings_and_prints_each_change(first_run: Path, tmp_path: Path) -> None:
    tmp_path = copy_of(first_run, tmp_path)
    before = saved_config(tmp_path)

    resumed = run_cli(["--resume", "--experiment", "r", "--frames", "3000", "--lr", "0.0001"], tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert "lr: 0.0005 -> 0.0001" in lines
    assert "frames: 1500 -> 3000" in lines
    assert not [line for line in lines if line.startswith(("gamma:", "env:", "workers:", "hidden_size:"))]
    after = saved_config(tmp_path)
    assert after["lr"] == 0.0001 and after["frames"] == 3000
    for name in ("env", "gamma", "value_coeff", "hidden_size", "seed", "workers", "envs_per_worker", "rollout",
                 "batch_size", "epochs", "minibatches", "entropy_coeff", "vtrace_c", "lr_schedule", "activation"):
        assert after[name] == before[name], f"{name}: saved {before[name]!r}, resumed with {after[name]!r}"
    units = {type(m).__name__ for m in asyncrl.load_policy(str(tmp_path / "r")).head.modules()}
    assert "ReLU" in units and "Tanh" not in units, units  # the loaded policy is the --activation relu model


def test_resume_refuses_another_env_or_model_shape(first_run: Path, tmp_path: Path) -> None:
    tmp_path = copy_of(first_run, tmp_path)
    before = saved_config(tmp_path)
    # Refused once the env is built to read its spaces (after the fork check): in a process of their own.
    assert_user_error(run_cli(["--resume", "--experiment", "r", "--hidden-size", "64"], tmp_path),
                      "--hidden-size 48", "--hidden-size 64")
    assert_user_error(run_cli(["--resume", "--experiment", "r", "--env", "Acrobot-v1"], tmp_path),
                      "'CartPole-v1'", "Acrobot-v1")
    assert_user_error(run_cli(["--resume", "--experiment", "r", "--activation", "tanh"], tmp_path),
                      "--activation relu", "--activation tanh")
    assert saved_config(tmp_path) == before  # a refused resume leaves the run as it was
