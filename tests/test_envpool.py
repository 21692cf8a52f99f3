"""EnvPool (`envpool:<task id>`): the same envs as gymnasium's ids, its NEXT_STEP auto-reset mapped onto the slots,
the bad-input lines, and a run through the forked engine. Learning runs are in scripts/envpool_check.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncrl.envs.base import EnvError
from asyncrl.envs.registry import make_env_spec, make_vec_env
from tests.conftest import read_metrics, run_cli
from tests.train_cli import assert_user_error

pytestmark = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="the envpool extra")


def _episodes(name: str, action: float, steps: int, n: int = 8, **settings: object) -> list[tuple[float, int, bool]]:
    """(return, length, truncated) of every episode `n` envs of `name` finish in `steps` steps of one fixed action."""
    env = make_vec_env(name, n, **settings)
    spec = env.spec
    obs = np.zeros((n, *spec.obs_shape), np.float32)
    final, reward = obs.copy(), np.zeros(n, np.float32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    env.reset(1, obs)
    actions = np.full((n, *spec.action_shape), action, dtype=spec.action_dtype)
    done = [e for _ in range(steps) for e in env.step(actions, obs, reward, term, trunc, final)]
    env.close()
    return [(e.ret, e.length, e.truncated) for e in done]


@pytest.mark.parametrize(("env_id", "action", "steps"), [("CartPole-v1", 1, 60), ("MountainCar-v0", 2, 201),
                                                         ("HalfCheetah-v5", 0.0, 1001)])
def test_envpool_and_gymnasium_ids_agree(env_id: str, action: float, steps: int) -> None:
    """Same spaces; for one fixed action, the same episodes (their start states are drawn by different generators,
    so CartPole's lengths and HalfCheetah's returns agree in distribution, MountainCar's exactly)."""
    ours, theirs = make_env_spec("envpool:" + env_id), make_env_spec(env_id)
    assert (ours.obs_shape, ours.obs_dtype, ours.action_space.shape) == (theirs.obs_shape, theirs.obs_dtype,
                                                                          theirs.action_space.shape)
    assert str(ours.action_space) == str(theirs.action_space) or ours.action_space.shape  # Box bounds: float64/32
    pool, gym_ = _episodes("envpool:" + env_id, action, steps), _episodes(env_id, action, steps)
    assert len(pool) >= 8 and len(gym_) >= 8
    (pr, pl, pt), (gr, gl, gt) = (np.array(e, dtype=np.float64).T for e in (pool, gym_))
    if env_id == "MountainCar-v0":  # pushing right never reaches the flag: -1 a step until the 200-step limit
        assert set(pool) == set(gym_) == {(-200.0, 200, True)}
    elif env_id == "CartPole-v1":  # pushing one way: the pole falls in 8 to 11 steps
        assert set(pl) <= {8, 9, 10, 11} and set(gl) <= {8, 9, 10, 11} and abs(pl.mean() - gl.mean()) < 0.6
        assert np.array_equal(pr, pl) and not pt.any() and not gt.any()
    else:  # no torque for the 1,000-step limit: a return near 0 either way
        assert set(pl) == set(gl) == {1000} and pt.all() and gt.all()
        assert abs(pr.mean()) < 1.0 and abs(gr.mean()) < 1.0 and pr.std() < 1.5 and gr.std() < 1.5


def test_next_step_reset_maps_onto_the_slots() -> None:
    """A 5-step limit: the 5th step is a truncation whose final observation is the state reached (a later state
    than the 4th step's), the 6th is EnvPool's reset step (skipped: no reward, no episode end, not trained on),
    and the episode counted 5 steps."""
    n = 4
    env = make_vec_env("envpool:CartPole-v1", n, env_kwargs={"max_episode_steps": 5})
    obs = np.zeros((n, 4), np.float32)
    final, reward = np.full((n, 4), np.nan, np.float32), np.zeros(n, np.float32)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    env.reset(7, obs)
    actions = np.array([0, 1, 0, 1])
    for _ in range(4):
        assert env.step(actions, obs, reward, term, trunc, final) == [] and not env.skipped.any()
    before = obs.copy()
    stats = env.step(actions, obs, reward, term, trunc, final)
    assert trunc.all() and not term.any() and (reward == 1).all()
    assert np.array_equal(final, obs) and not np.array_equal(final, before)
    assert [(s.length, s.ret, s.truncated) for s in stats] == [(5, 5.0, True)] * n
    assert env.step(actions, obs, reward, term, trunc, final) == []
    assert env.skipped.all() and (reward == 0).all() and not (term | trunc).any()
    assert np.abs(obs).max() <= 0.05  # CartPole's first observations: every entry within +-0.05
    env.step(actions, obs, reward, term, trunc, final)
    assert not env.skipped.any() and (reward == 1).all()
    env.close()


def test_dict_observations_are_flattened_and_seeds_repeat() -> None:
    """DeepMind Control's Dict (position 8, velocity 9) is one 17-float vector; the same seed, the same start."""
    spec = make_env_spec("envpool:CheetahRun-v1")
    assert spec.obs_shape == (17,) and not spec.is_dict and spec.gaussian_dims == 6
    env = make_vec_env("envpool:CheetahRun-v1", 2)
    a, b = np.zeros((2, 17), np.float32), np.zeros((2, 17), np.float32)
    env.reset(3, a)
    env.reset(4, b)
    assert not np.array_equal(a, b)
    env.reset(3, b)
    assert np.array_equal(a, b)
    env.close()


def test_bad_envpool_names_and_kwargs_are_one_line() -> None:
    with pytest.raises(EnvError, match=r"unknown EnvPool task 'CheetaRun-v1'; did you mean: envpool:CheetahRun-v1"):
        make_env_spec("envpool:CheetaRun-v1")
    with pytest.raises(EnvError, match="asyncrl sets num_envs"):
        make_env_spec("envpool:Pong-v5", env_kwargs={"num_envs": 3})
    with pytest.raises(EnvError, match="'Go9x9-v1' has 2 players an env; the envpool: backend runs single-player"):
        make_env_spec("envpool:Go9x9-v1")


def test_a_dict_with_discrete_entries_is_one_vector() -> None:
    """MiniGrid: direction Discrete(4), a 7x7x3 grid and the mission's 96 bytes: 1 + 147 + 96 floats."""
    env = make_vec_env("envpool:MiniGrid-Empty-5x5-v0", 2)
    assert env.spec.obs_shape == (244,) and env.spec.obs_dtype == np.float32
    obs = np.full((2, 244), -1.0, np.float32)
    env.reset(0, obs)
    assert obs[:, 0].min() >= 0 and obs[:, 0].max() <= 3 and (obs >= 0).all() and obs[:, 1:148].any()
    env.close()


def test_unknown_task_exits_2_and_a_missing_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_user_error(run_cli(["--env", "envpool:Pongg-v5", "--frames", "100"], tmp_path), "envpool:Pong-v5")
    assert not list(tmp_path.rglob("*"))
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError, as without the extra
    with pytest.raises(EnvError, match=r"envpool extra .*pip install -e '\.\[envpool\]' in the asyncrl checkout"):
        make_env_spec("envpool:Pong-v5")


def test_dmc_trains_through_the_forked_engine(tmp_path: Path) -> None:
    proc = run_cli(["--env", "envpool:CheetahRun-v1", "--workers", "1", "--envs-per-worker", "8", "--rollout", "16",
                    "--batch-size", "128", "--minibatches", "1", "--epochs", "1", "--frames", "3000",
                    "--report-interval", "1"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "envpool_CheetahRun-v1")
    assert records[-1]["env_steps"] >= 3000


def test_threads_are_the_splits_share_of_the_usable_cores() -> None:
    from asyncrl.envs.envpool_env import split_threads
    from asyncrl.system import usable_cpus

    assert split_threads(64, 2, 2, cpus=16, ranks=1) == 4  # 16 cores / (2 workers x 2 splits)
    assert split_threads(64, 2, 2, cpus=16, ranks=2) == 2  # two ranks on the node share them
    assert split_threads(3, 1, 1, cpus=16, ranks=1) == 3 and split_threads(64, 4, 2, cpus=2, ranks=1) == 1
    env = make_vec_env("envpool:CartPole-v1", 8, workers=1, worker_splits=1)
    assert env.env.config["num_threads"] == min(8, usable_cpus())  # the affinity mask and quota, here
    env.close()
