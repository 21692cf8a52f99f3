"""Loading a checkpoint cannot run code: `--resume` and `asyncrl-enjoy` refuse a planted pickled callable."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.store.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
from tests import launcher
from tests.conftest import run_cli

SMALL = ["--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "4", "--rollout", "16", "--batch-size", "64",
         "--minibatches", "1", "--report-interval", "1"]


class WritesMarker:
    """Unpickling this would call os.system-like code: it writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def plant(run_dir: Path, marker: Path) -> Path:
    """A newer checkpoint with a valid checksum whose learner state is a pickled callable."""
    buf = io.BytesIO()
    torch.save({"learner": {"model": WritesMarker(marker), "version": 10**6}, "env_steps": 0,
                "config": Config(env="CartPole-v1").to_json(), "env": "CartPole-v1"}, buf)
    path = run_dir / "checkpoints" / "ckpt_9999999999.pt"
    path.write_bytes(buf.getvalue())
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(buf.getvalue()).hexdigest())
    return path


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    train_dir = tmp_path_factory.mktemp("train")
    result = run_cli([*SMALL, "--frames", "2000", "--experiment", "run"], train_dir, timeout=180)
    assert result.returncode == 0, result.stderr
    assert list_checkpoints(str(train_dir / "run"))
    return train_dir / "run"


def test_learner_checkpoint_round_trips_with_weights_only(tmp_path: Path) -> None:
    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path), experiment="x")
    learner = APPOLearner(cfg, make_env_spec("CartPole-v1"), torch.device("cpu"))
    np.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    path = save_checkpoint(cfg.run_dir, 7, {"learner": learner.state_dict(), "env_steps": 1,
                                            "config": cfg.to_json()}, 3)
    torch.load(path, weights_only=True)  # plain data only: no allow-listed globals needed
    expected = (np.random.rand(), random.random(), torch.rand(1).item())
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    _, state = load_latest_checkpoint(cfg.run_dir)
    learner.load_state_dict(state["learner"])
    assert (np.random.rand(), random.random(), torch.rand(1).item()) == expected


def test_resume_refuses_a_checkpoint_that_would_run_code(trained_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    planted = plant(trained_run, marker)
    try:
        result = run_cli([*SMALL, "--frames", "4000", "--experiment", "run", "--resume"], trained_run.parent,
                         timeout=180)
    finally:
        for f in (planted, Path(f"{planted}.sha256")):
            f.unlink(missing_ok=True)
    assert not marker.exists(), "unpickling ran the planted code"
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "refused to load" in line]
    assert len(errors) == 1 and "ckpt_9999999999.pt" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_enjoy_refuses_a_checkpoint_that_would_run_code(trained_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    planted = plant(trained_run, marker)
    try:
        result = launcher.run("enjoy", [str(trained_run), "--episodes", "1"], timeout=120,
                              env={**os.environ, "PYTHONPATH": "."})
    finally:
        for f in (planted, Path(f"{planted}.sha256")):
            f.unlink(missing_ok=True)
    assert not marker.exists(), "unpickling ran the planted code"
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "refused to load" in result.stderr, result.stderr
    # The run's own checkpoints still play.
    ok = launcher.run("enjoy", [str(trained_run), "--episodes", "1", "--max-steps", "50"], timeout=120)
    assert ok.returncode == 0, ok.stderr
