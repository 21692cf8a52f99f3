"""Same seed, same start: --seed fixes the initial weights, and --deterministic makes the learning reproducible."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.agents.registry import make_learner
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import flat_state
from asyncrl.resolve import parse_command_line
from asyncrl.runtime.host.seeding import weights_sha256
from asyncrl.runtime.roles.learner import set_up_torch
from asyncrl.runtime.store.checkpoint import load_latest_checkpoint
from tests.conftest import run_cli

# One batch: the initial weights are written before the first update.
SHORT = ["--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "2", "--rollout", "8", "--batch-size", "16",
         "--minibatches", "1", "--frames", "16"]
# What metrics.jsonl says about learning; times, rates, queue depths, memory and stage fractions may differ.
LEARNING_FIELDS = ("frames", "env_steps", "episodes", "episode_return_mean", "episode_return_mean_20",
                   "episode_len_mean", "policy_version", "dropped_stale", "learner_updates", "policy_loss",
                   "value_loss", "entropy", "kl", "grad_norm", "clip_fraction", "policy_lag_mean", "policy_lag_max",
                   "learning_rate", "nonfinite_updates")


def initial_weights(train_dir: Path, experiment: str, seed: int) -> str:
    result = run_cli([*SHORT, "--seed", str(seed), "--experiment", experiment], train_dir, timeout=180)
    assert result.returncode == 0, result.stderr
    return (train_dir / experiment / "initial_weights.sha256").read_text().strip()


def built_weights(train_dir: Path, experiment: str, seed: int) -> str:
    """The SHA-256 of the weights the learner process of `asyncrl-train SHORT --seed SEED` starts from, built here
    as that process builds them: the command line's Config, set_up_torch (threads and seeds), make_learner, the
    published tensors (flat_state) and their checksum. This process's generators and thread count are put back."""
    argv = [*SHORT, "--seed", str(seed), "--experiment", experiment, "--train-dir", str(train_dir)]
    cfg = parse_command_line(argv).config
    threads, py_state, np_state = torch.get_num_threads(), random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            spec = make_env_spec(cfg)
            learner = make_learner(cfg, spec, set_up_torch(cfg, spec.batched))
            flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in flat_state(learner.policy_module())])
    finally:
        torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
    return weights_sha256(flat.numpy())


def test_seed_fixes_the_initial_weights(tmp_path: Path) -> None:
    """One run and two builds of its learner here: the run (a fresh process) and this process start from the same
    weights for --seed 5, and --seed 6 gives others."""
    first = initial_weights(tmp_path, "a", 5)
    again, other = built_weights(tmp_path, "b", 5), built_weights(tmp_path, "c", 6)
    assert len(first) == 64
    assert first == again, "two learners with --seed 5 started from different weights"
    assert first != other, "--seed 5 and --seed 6 started from the same weights"


def learning_records(train_dir: Path, experiment: str) -> list[str]:
    lines = (train_dir / experiment / "metrics.jsonl").read_text().splitlines()
    return [json.dumps({k: json.loads(line).get(k) for k in LEARNING_FIELDS}) for line in lines]


def final_state(train_dir: Path, experiment: str) -> tuple[str, dict[str, Any]]:
    """The newest checkpoint's name and what must repeat: the learner's whole state and the env-step count (the
    config names the experiment and `run` holds wall-clock times, so they differ)."""
    path, state = load_latest_checkpoint(str(train_dir / experiment))
    return Path(path).name, {"learner": state["learner"], "env_steps": state["env_steps"]}


def differences(x: Any, y: Any, where: str = "") -> list[str]:
    """Where two checkpoint states differ: tensors bit for bit (dtype and shape too), everything else by ==."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        same = (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                and x.shape == y.shape and torch.equal(x, y))
        return [] if same else [where]
    if isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            return [f"{where} keys"]
        return [d for k in x for d in differences(x[k], y[k], f"{where}/{k}")]
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
        return [d for i, (a, b) in enumerate(zip(x, y)) for d in differences(a, b, f"{where}[{i}]")]
    return [] if type(x) is type(y) and x == y else [where]


def test_deterministic_runs_repeat_exactly(tmp_path: Path) -> None:
    flags = ["--env", "CartPole-v1", "--deterministic", "--seed", "3", "--frames", "12000"]
    for name, fresh in (("one", True), ("two", False)):
        # A fresh interpreter (the installed script, its own random hash seed) and a fork of the warm one
        # (tests/launcher.py: another hash seed, and torch imported before the workers fork): two forks of one
        # warm interpreter would share its hash seed and library RNG states, which could hide a run that depends
        # on them; one fresh start is enough to differ from the other in both.
        result = run_cli([*flags, "--experiment", name], tmp_path, timeout=300, fresh=fresh)
        assert result.returncode == 0, result.stderr
    one, two = learning_records(tmp_path, "one"), learning_records(tmp_path, "two")
    assert one == two
    # The final checkpoints too: every tensor (weights, optimizer moments and steps, normaliser statistics, the
    # generators' states) and every counter of the learner, exactly.
    (name_one, state_one), (name_two, state_two) = final_state(tmp_path, "one"), final_state(tmp_path, "two")
    assert name_one == name_two
    differ = differences(state_one, state_two)
    assert not differ, f"{len(differ)} entries differ, first {differ[:5]}"
    records = [json.loads(r) for r in one]
    assert len(records) >= 5  # one record per update: 12k steps / 2,048 per batch (the vector_batched preset)
    assert [r["policy_version"] for r in records] == list(range(2, len(records) + 2))
    assert all(r["policy_lag_max"] == 0 for r in records)  # each batch collected by the newest policy
    assert records[-1]["env_steps"] >= 12000 and records[-1]["episodes"] > 0
    assert records[-1]["episode_return_mean"] > records[0]["episode_return_mean"] or records[0]["episodes"] == 0
