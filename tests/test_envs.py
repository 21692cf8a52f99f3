"""Env backends and the registry, on real envs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from asyncrl.config import Config
from asyncrl.envs.base import EnvError, EnvSpec, EpisodeStats, VecEnv
from asyncrl.envs.gym_env import GymVecEnv
from asyncrl.envs.registry import make_env_spec, make_vec_env

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent


@pytest.fixture(autouse=True)
def _custom_env_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS_DIR))


def buffers(spec: EnvSpec, n: int) -> tuple[np.ndarray, ...]:
    """obs, reward, terminated, truncated and final-obs arrays for `VecEnv.step`."""
    obs = np.zeros((n, *spec.obs_shape), spec.obs_dtype)
    return obs, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), np.zeros_like(obs)


def random_actions(spec: EnvSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, spec.num_actions, n)


# --- Atari -----------------------------------------------------------------------------------------------


def test_atari_pong_obs_and_clipped_rewards() -> None:
    env = make_vec_env("atari_pong", 2)
    assert env.spec == make_env_spec("atari_pong")
    assert env.spec.obs_shape == (4, 84, 84) and env.spec.obs_dtype == np.uint8 and env.spec.frameskip == 4
    obs, rew, done, trunc, final = buffers(env.spec, 2)
    env.reset(0, obs)
    assert obs.any()
    again = obs.copy()
    env.reset(2**31 - 1, again)  # seeds past the C int range wrap rather than fail
    env.reset(0, again)
    np.testing.assert_array_equal(obs, again)
    rng = np.random.default_rng(0)
    rewards = []
    for _ in range(300):
        env.step(random_actions(env.spec, 2, rng), obs, rew, done, trunc, final)
        rewards.append(rew.copy())
    env.close()
    assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
    assert np.any(np.asarray(rewards) != 0)


def play_lockstep(game: str, steps: int, until_game_over: bool = False) -> dict[str, list]:
    """Step a training and an eval env with the same seed and actions; their games are identical."""
    train, evl = make_vec_env(game, 1, training=True), make_vec_env(game, 1, training=False)
    bufs = {m: buffers(train.spec, 1) for m in ("train", "eval")}
    train.reset(7, bufs["train"][0])
    evl.reset(7, bufs["eval"][0])
    rng = np.random.default_rng(7)
    log: dict[str, list] = {k: [] for k in ("rew", "done", "stats", "continued")}
    for _ in range(steps):
        acts = random_actions(train.spec, 1, rng)
        prev = bufs["train"][0].copy()
        out = {"train": train.step(acts, *bufs["train"]), "eval": evl.step(acts, *bufs["eval"])}
        for m in out:
            log["rew"].append((m, float(bufs[m][1][0])))
            log["done"].append((m, bool(bufs[m][2][0])))
            log["stats"] += [(m, s) for s in out[m]]
        if bufs["train"][2][0] and not out["train"]:  # life loss: the frame stack continues, no reset
            log["continued"].append(np.array_equal(bufs["train"][0][0, :3], prev[0, 1:]))
        if until_game_over and out["eval"]:
            break
    train.close()
    evl.close()
    return log


def by_mode(entries: list, mode: str) -> list:
    return [v for m, v in entries if m == mode]


def test_atari_breakout_life_loss_dones_but_whole_game_stats() -> None:
    log = play_lockstep("atari_breakout", 3000, until_game_over=True)
    train_stats, eval_stats = by_mode(log["stats"], "train"), by_mode(log["stats"], "eval")
    assert len(eval_stats) == 1, "a random Breakout game should end within 3000 steps"
    assert train_stats == eval_stats  # same game: whole-game raw return and length in both modes
    game = eval_stats[0]
    assert game.length == len(by_mode(log["done"], "eval"))
    assert game.ret == sum(by_mode(log["rew"], "eval"))
    # Breakout has 5 lives: training mode is done at each of the 4 life losses and at game over.
    assert sum(by_mode(log["done"], "train")) == 5
    assert sum(by_mode(log["done"], "eval")) == 1  # eval mode: no life-loss dones
    assert log["continued"] == [True] * 4


def test_atari_training_rewards_are_sign_of_raw() -> None:
    log = play_lockstep("atari_space_invaders", 300)  # aliens are worth 5-30 points
    train_rew, eval_rew = np.array(by_mode(log["rew"], "train")), np.array(by_mode(log["rew"], "eval"))
    assert eval_rew.max() > 1.0
    np.testing.assert_array_equal(train_rew, np.sign(eval_rew))


# --- gymnasium envs ---------------------------------------------------------------------------------------


def test_cartpole_same_step_autoreset_and_stats() -> None:
    n = 4
    env = make_vec_env("CartPole-v1", n, env_vectorization="loop")  # the batched CartPole: test_vector_env.py
    assert env.spec.frameskip == 1 and env.spec.obs_dtype == np.float32 and env.spec.discrete
    obs, rew, done, trunc, final = buffers(env.spec, n)
    env.reset(3, obs)
    for i in range(n):  # env i is seeded with seed + i
        np.testing.assert_array_equal(obs[i], gym.make("CartPole-v1").reset(seed=3 + i)[0])
    rng = np.random.default_rng(0)
    t = np.zeros(n, int)
    finished: list[EpisodeStats] = []
    for _ in range(300):
        stats = env.step(random_actions(env.spec, n, rng), obs, rew, done, trunc, final)
        t += 1
        assert np.all(rew == 1.0)
        assert [(s.ret, s.length) for s in stats] == [(float(t[i]), int(t[i])) for i in np.flatnonzero(done)]
        assert np.all(np.abs(obs[done]) <= 0.05)  # already the first obs of the next episode
        t[done] = 0
        finished += stats
    env.close()
    assert len(finished) > 10


class RecordActions(gym.Wrapper):
    """Keeps every action passed to the wrapped env."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def step(self, action):
        self.actions.append(np.array(action))
        return self.env.step(action)


def test_pendulum_actions_are_clipped() -> None:
    env = GymVecEnv("Pendulum-v1", lambda: RecordActions(gym.make("Pendulum-v1")), 3)
    assert env.spec == make_env_spec("Pendulum-v1")
    assert env.spec.action_shape == (1,) and env.spec.action_dtype == np.float32
    obs, rew, done, trunc, final = buffers(env.spec, 3)
    env.reset(0, obs)
    actions = np.array([[5.0], [-7.5], [0.5]], np.float32)
    all_stats = []
    for _ in range(200):
        all_stats += env.step(actions, obs, rew, done, trunc, final)
    np.testing.assert_array_equal([e.actions[-1] for e in env.envs], [[2.0], [-2.0], [0.5]])
    assert all(e.actions[-1].dtype == np.float32 for e in env.envs)
    assert trunc.all() and not done.any() and [s.length for s in all_stats] == [200] * 3  # TimeLimit truncation
    assert all(s.truncated for s in all_stats)
    assert all(s.ret < 0 for s in all_stats)
    env.close()


def test_custom_env_by_module_callable() -> None:
    env = make_vec_env("custom_env:make_echo_env", 2)
    assert env.spec.obs_dtype == np.float32 and env.spec.action_shape == (2,)
    obs, rew, done, trunc, final = buffers(env.spec, 2)
    env.reset(0, obs)
    env.step(np.array([[3.0, -3.0], [0.5, 1.5]], np.float32), obs, rew, done, trunc, final)
    np.testing.assert_array_equal(obs, [[1.0, -2.0], [0.5, 1.5]])  # clipped to the Box bounds
    env.step(np.zeros((2, 2), np.float32), obs, rew, done, trunc, final)
    stats = env.step(np.ones((2, 2), np.float32), obs, rew, done, trunc, final)
    assert done.all() and np.all(obs == 0.0)  # episode of 3 steps, reset obs is zeros
    assert [(s.ret, s.length) for s in stats] == [(3.0, 3)] * 2
    env.close()


# --- null env ---------------------------------------------------------------------------------------------


def test_null_env() -> None:
    env = make_vec_env("null", 5)
    assert env.spec == make_env_spec("null") and env.spec.obs_shape == (4,) and env.spec.num_actions == 2
    obs, rew, done, trunc, final = buffers(env.spec, 5)
    env.reset(0, obs)
    for t in range(1, 201):
        stats = env.step(np.zeros(5, np.int64), obs, rew, done, trunc, final)
        assert np.all(rew == 1.0) and np.all(done == (t % 100 == 0))
        assert stats == ([EpisodeStats(100.0, 100)] * 5 if t % 100 == 0 else [])


# --- registry errors and import weight --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("atari_pongg", "atari_pong"), ("CartPol-v1", "CartPole-v1"), ("breakout", "atari_breakout")],
)
def test_unknown_name_suggests_close_matches(name: str, suggestion: str) -> None:
    with pytest.raises(EnvError, match=f"did you mean: {suggestion}") as info:
        make_env_spec(name)
    message = str(info.value)
    assert "\n" not in message and "module:callable" in message


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("custom_env:make_dict_obs_env", r"Dict observation space whose key 'mode' is Discrete\(3\); asyncrl supports"),
        ("custom_env:make_not_an_env", "neither a gymnasium.Env nor a gymnasium.vector.VectorEnv"),
        ("custom_env:no_such_callable", "has no attribute 'no_such_callable'"),
        ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
    ],
)
def test_bad_custom_envs(name: str, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        make_vec_env(name, 2)


def test_registry_import_is_light() -> None:
    code = "import sys, asyncrl.envs.registry; print('torch' in sys.modules, 'ale_py' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_backends_are_vec_envs() -> None:
    for name in ("null", "CartPole-v1", "atari_pong"):
        env = make_vec_env(name, 1)
        assert isinstance(env, VecEnv) and env.num_envs == 1
        env.close()


def test_each_name_is_served_by_one_backend_row_with_its_preset_family() -> None:
    from asyncrl.envs.registry import BACKENDS, backend_for, preset_family
    from asyncrl.presets import PRESETS

    assert [backend_for(n).name for n in ("null", "doom_basic", "atari_pong", "Hopper-v5", "CartPole-v1",
                                          "custom_env:make_echo_env")] == [
        "null", "doom", "atari", "mujoco", "gymnasium", "gymnasium"]
    assert BACKENDS[-1].matches("anything")  # the catch-all row comes last
    assert preset_family("atari_pong") == "atari" and preset_family("CartPole-v1") is None
    assert all(b.family is None or callable(b.family) or b.family in PRESETS for b in BACKENDS)
    assert preset_family("gymnax:Breakout-MinAtar") == "gymnax_minatar" in PRESETS  # a family chosen by name
    assert preset_family("gymnax:CartPole-v1") is None
    fields = {f.name for f in dataclasses.fields(Config)}
    assert all(set(b.options + b.train_options) <= fields for b in BACKENDS)  # options are Config fields


def test_a_config_gives_the_backend_its_options() -> None:
    assert make_env_spec(Config(env="Pendulum-v1", env_kwargs='{"g": 3.5}')) == make_env_spec("Pendulum-v1")
    env = make_vec_env({"env": "Pendulum-v1", "env_kwargs": '{"g": 3.5}'}, 1)
    assert env.envs[0].unwrapped.g == 3.5
    env.close()
    with pytest.raises(EnvError, match="--env-kwargs applies to gymnasium ids"):
        make_vec_env(Config(env="null", env_kwargs='{"g": 1}'), 1)
