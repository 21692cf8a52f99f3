"""`isaaclab:` (asyncrl/envs/isaaclab_env.py) on a torch vector env with Isaac Lab's interface (tests/isaac_envs.py):
same-step resets, truncations bootstrapped from the observation before the cut, actions handed over as tensors
on the env's device, a run through the forked engine, and the one line where Isaac Lab is missing. The real
Isaac Lab runs in scripts/gpu_check.sh."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.envs.base import EnvError
from asyncrl.envs.registry import make_vec_env
from tests.conftest import read_metrics, run_cli

NAME = "isaaclab:tests.isaac_envs:cartpole"


def _buffers(n: int) -> tuple[np.ndarray, ...]:
    obs = np.zeros((n, 4), np.float32)
    return obs, np.full((n, 4), np.nan, np.float32), np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)


def test_time_limits_bootstrap_from_the_last_observation_before_the_reset() -> None:
    n = 4
    env = make_vec_env(NAME, n, env_kwargs={"max_steps": 5})
    assert env.spec.obs_shape == (4,) and env.spec.batched and env.spec.gaussian_dims == 1
    obs, final, reward, term, trunc = _buffers(n)
    env.reset(3, obs)
    actions = np.zeros((n, 1), np.float32)
    for _ in range(4):
        assert env.step(actions, obs, reward, term, trunc, final) == []
    before = obs.copy()
    stats = env.step(actions, obs, reward, term, trunc, final)
    assert trunc.all() and not term.any() and (reward == 1).all()
    assert np.array_equal(final, before)  # Isaac Lab reset these envs already: the step's start state
    assert np.abs(obs).max() <= 0.05  # the new episodes' first observations
    assert [(s.length, s.ret, s.truncated) for s in stats] == [(5, 5.0, True)] * n
    seen = env.env.actions_seen[-1]
    assert isinstance(seen, torch.Tensor) and seen.device == env.device and seen.dtype == torch.float32
    env.close()


def test_terminations_leave_the_final_observation_alone_and_actions_are_clipped() -> None:
    n = 2
    env = make_vec_env(NAME, n, env_kwargs={"max_steps": 1000})
    obs, final, reward, term, trunc = _buffers(n)
    env.reset(0, obs)
    ended = []
    for _ in range(100):
        ended += env.step(np.full((n, 1), 5.0, np.float32), obs, reward, term, trunc, final)
    assert ended and not any(s.truncated for s in ended) and np.isnan(final).all()
    assert env.env.actions_seen[-1].max().item() == 1.0  # clipped to the Box


def test_isaaclab_env_trains_through_the_forked_engine(tmp_path: Path) -> None:
    proc = run_cli(["--env", NAME, "--workers", "1", "--envs-per-worker", "32", "--rollout", "16", "--batch-size",
                    "256", "--minibatches", "1", "--epochs", "1", "--frames", "4000", "--report-interval", "1"],
                   tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "isaaclab_tests.isaac_envs_cartpole")
    assert records[-1]["env_steps"] >= 4000 and records[-1]["episode_return_mean"] is not None


def test_without_isaac_lab_a_task_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.envs.isaaclab_env import make_isaaclab

    monkeypatch.setitem(sys.modules, "isaaclab.app", None)  # `from isaaclab.app import ...` fails, as without it
    with pytest.raises(EnvError, match=r"^isaaclab:Isaac-Cartpole-Direct-v0 needs Isaac Lab .*pip install isaaclab"):
        make_isaaclab("Isaac-Cartpole-Direct-v0", 1)
