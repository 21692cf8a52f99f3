"""GymnaxVectorEnv: gymnax's JAX envs as one batched gymnasium VectorEnv (the optional gymnax extra)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("gymnax")

import jax.numpy as jnp  # noqa: E402
from gymnasium.vector import AutoresetMode  # noqa: E402

from asyncrl.envs.base import EnvError  # noqa: E402
from asyncrl.envs.gymnax_env import GymnaxVectorEnv, _gym_space, gymnax_spaces, to_numpy  # noqa: E402

LIMIT = 25  # CartPole's time limit in the episode tests: random play both terminates and reaches it


@pytest.fixture(scope="module")
def cartpole() -> GymnaxVectorEnv:
    env = GymnaxVectorEnv("CartPole-v1", 16, max_steps_in_episode=LIMIT)
    yield env
    env.close()


@pytest.fixture(scope="module")
def breakout() -> GymnaxVectorEnv:
    env = GymnaxVectorEnv("Breakout-MinAtar", 8)
    yield env
    env.close()


@pytest.mark.parametrize("env_id, obs_shape, n_actions", [("Breakout-MinAtar", (10, 10, 4), 3),
                                                           ("CartPole-v1", (4,), 2)])
def test_spaces_shapes_and_dtypes(env_id: str, obs_shape: tuple[int, ...], n_actions: int,
                                  breakout: GymnaxVectorEnv) -> None:
    env = breakout if env_id == "Breakout-MinAtar" else GymnaxVectorEnv(env_id, 8)
    assert isinstance(env, gym.vector.VectorEnv) and env.num_envs == 8
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.single_observation_space == gym.spaces.Box(env.single_observation_space.low,
                                                          env.single_observation_space.high, obs_shape, np.float32)
    assert env.single_action_space == gym.spaces.Discrete(n_actions)
    assert env.observation_space.shape == (8, *obs_shape) and env.observation_space.dtype == np.float32
    assert env.action_space == gym.spaces.MultiDiscrete([n_actions] * 8)
    assert env.env_params.max_steps_in_episode == (1000 if "MinAtar" in env_id else 500)

    obs, info = env.reset(seed=0)
    assert obs.shape == (8, *obs_shape) and obs.dtype == np.float32 and info == {}
    assert env.observation_space.contains(obs)
    for _ in range(3):
        obs, reward, terminated, truncated, infos = env.step(env.action_space.sample())
        assert obs.shape == (8, *obs_shape) and obs.dtype == np.float32
        assert reward.shape == terminated.shape == truncated.shape == (8,)
        assert reward.dtype == np.float32 and terminated.dtype == truncated.dtype == np.bool_
        assert isinstance(infos, dict)


def test_channels_first_is_the_transpose(breakout: GymnaxVectorEnv) -> None:
    last, _ = breakout.reset(seed=3)
    env = GymnaxVectorEnv("Breakout-MinAtar", 8, channels_first=True)
    first, _ = env.reset(seed=3)
    assert env.single_observation_space.shape == (4, 10, 10) and first.shape == (8, 4, 10, 10)
    np.testing.assert_array_equal(first, np.moveaxis(last, 3, 1))


def test_same_step_autoreset_and_time_limit(cartpole: GymnaxVectorEnv) -> None:
    rng = np.random.default_rng(0)
    obs, _ = cartpole.reset(seed=0)
    length = np.zeros(16, dtype=np.int64)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(200):
        prev = obs
        obs, reward, terminated, truncated, infos = cartpole.step(rng.integers(0, 2, 16))
        length += 1
        assert not (terminated & truncated).any()
        np.testing.assert_array_equal(reward, np.ones(16, np.float32))
        ended = terminated | truncated
        assert (length <= LIMIT).all()
        np.testing.assert_array_equal(truncated, ended & ~terminated & (length == LIMIT))  # only at the limit
        assert (length[~ended] < LIMIT).all()  # none runs past it
        if not ended.any():
            assert "final_obs" not in infos and "_final_obs" not in infos
            assert not np.array_equal(obs, prev)
            continue
        np.testing.assert_array_equal(infos["_final_obs"], ended)
        final = infos["final_obs"]
        assert final.shape == obs.shape and final.dtype == np.float32
        np.testing.assert_array_equal(final[~ended], obs[~ended])
        assert (obs[ended] != final[ended]).any(axis=1).all()  # a fresh episode
        assert (np.abs(obs[ended]) <= 0.05).all()  # CartPole's reset draws every coordinate in [-0.05, 0.05]
        terminal = final[terminated]
        assert ((np.abs(terminal[:, 0]) > 2.4) | (np.abs(terminal[:, 2]) > 0.2094)).all()
        ends["terminated"] += int(terminated.sum())
        ends["truncated"] += int(truncated.sum())
        length[ended] = 0
    assert ends["terminated"] > 10 and ends["truncated"] > 10, ends


def test_same_seed_same_observations(cartpole: GymnaxVectorEnv) -> None:
    actions = np.random.default_rng(1).integers(0, 2, (40, 16))

    def play(seed: int) -> list[np.ndarray]:
        out = [cartpole.reset(seed=seed)[0].copy()]
        for a in actions:
            obs, _, _, _, infos = cartpole.step(a)
            out += [obs.copy(), infos.get("final_obs", obs).copy()]
        return out

    first, again, other = play(7), play(7), play(8)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    # the construction seed is the first reset's; seeds per env are reproducible too
    made = GymnaxVectorEnv("CartPole-v1", 16, seed=7, max_steps_in_episode=LIMIT)
    np.testing.assert_array_equal(made.reset()[0], first[0])
    per_env = cartpole.reset(seed=list(range(16)))[0]
    np.testing.assert_array_equal(cartpole.reset(seed=list(range(16)))[0], per_env)
    assert len({tuple(row) for row in per_env}) == 16


def test_errors(cartpole: GymnaxVectorEnv) -> None:
    with pytest.raises(EnvError, match="not a gymnax env"):
        GymnaxVectorEnv("NoSuchEnv-v0", 2)
    with pytest.raises(EnvError, match="takes no bogus"):
        GymnaxVectorEnv("CartPole-v1", 2, bogus=1)
    from gymnax.environments import spaces

    with pytest.raises(EnvError, match="Dict observation space"):
        _gym_space(spaces.Dict({"a": spaces.Discrete(2)}), "observation", "X")
    with pytest.raises(RuntimeError, match="before reset"):
        GymnaxVectorEnv("CartPole-v1", 2).step(np.zeros(2, np.int64))
    cartpole.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        cartpole.step(np.zeros(3, np.int64))


def test_to_numpy_is_zero_copy_on_cpu() -> None:
    x = jnp.arange(4096 * 4, dtype=jnp.float32).reshape(4096, 4)
    a = to_numpy(x)
    assert a.ctypes.data == x.unsafe_buffer_pointer() and not a.flags.writeable
    del x
    assert a[1, 0] == 4.0  # the view keeps the buffer alive


def test_spaces_and_a_jax_free_import() -> None:
    """gymnax_spaces gives the env's spaces; importing the module leaves JAX out, so a forking process can use it."""
    env = GymnaxVectorEnv("Breakout-MinAtar", 1, channels_first=True)
    assert gymnax_spaces("Breakout-MinAtar", channels_first=True) == (env.single_observation_space,
                                                                      env.single_action_space)
    code = "import sys, asyncrl.envs.gymnax_env; assert 'jax' not in sys.modules and 'gymnax' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
