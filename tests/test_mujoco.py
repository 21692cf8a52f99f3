"""gymnasium's MuJoCo tasks run with the mujoco preset (the optional `mujoco` extra, installed by make install)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asyncrl.resolve import config_from_flags
from tests.conftest import run_cli

mujoco = pytest.importorskip("mujoco", reason="mujoco is not installed (pip install 'asyncrl[mujoco]')")


def test_mujoco_ids_get_the_mujoco_preset() -> None:
    cfg = config_from_flags(env="Hopper-v5")
    assert (cfg.normalize_obs, cfg.normalize_returns, cfg.rollout, cfg.batch_size, cfg.epochs, cfg.lr) == (
        True, True, 64, 2048, 10, 3e-4)
    cfg.validate()
    assert not config_from_flags(env="Pendulum-v1").normalize_obs  # other continuous envs keep the vector preset


def test_hopper_trains_with_finite_losses(tmp_path: Path) -> None:
    proc = run_cli(["--env", "Hopper-v5", "--frames", "6000", "--report-interval", "1", "--experiment", "hop"],
                   tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "hop" / "config.json").read_text())["normalize_obs"]  # the mujoco preset
    records = [json.loads(line) for line in (tmp_path / "hop" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if r.get("learner_updates")]
    assert trained and records[-1]["episodes"] > 0 and records[-1]["nonfinite_updates"] == 0
    assert all(math.isfinite(r[k]) for r in trained for k in ("policy_loss", "value_loss", "entropy"))
