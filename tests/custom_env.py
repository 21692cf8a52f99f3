"""Tiny gymnasium envs loaded by name (`custom_env:<callable>`) in test_envs.py."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class EchoEnv(gym.Env):
    """Observes the (clipped) action it was given; reward 1.0; episodes of 3 steps."""

    observation_space = gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Box(np.array([-1, -2], np.float32), np.array([1, 2], np.float32))

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2), {}

    def step(self, action: np.ndarray):
        self.t += 1
        return np.asarray(action, dtype=np.float64), 1.0, self.t >= 3, False, {}


class DictObsEnv(EchoEnv):
    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float64)})


class MultiDiscreteActionEnv(EchoEnv):
    action_space = gym.spaces.MultiDiscrete([2, 3])


def make_echo_env() -> gym.Env:
    return EchoEnv()


def make_dict_obs_env() -> gym.Env:
    return DictObsEnv()


def make_not_an_env() -> object:
    return object()
