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
    """A Dict observation with a member asyncrl does not support (a Discrete key): refused at start."""

    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float64),
                                         "mode": gym.spaces.Discrete(3)})


class SignMatch(gym.Env):
    """A Dict observation: a channels-last uint8 image ("screen", brightness 5 + 10 * (step % 8)) and a vector
    ("cue", random in [-1, 1]). Reward 1 when the action is 1 exactly where cue[0] > 0; 8 steps, then a time-limit
    truncation (a random policy earns 4, the best 8). The truncated episode's final screen looks like a first
    one (brightness 5): a brightness never trained on would let the bootstrapped value run away."""

    observation_space = gym.spaces.Dict({
        "screen": gym.spaces.Box(0, 255, shape=(36, 36, 3), dtype=np.uint8),
        "cue": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
    })
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0
        self.cue = np.zeros(2, np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        self.cue = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return {"screen": np.full((36, 36, 3), 5 + 10 * (self.t % 8), np.uint8), "cue": self.cue.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int):
        reward = float(int(action) == int(self.cue[0] > 0))
        self.t += 1
        return self._obs(), reward, False, self.t >= 8, {}


class MultiDiscreteActionEnv(EchoEnv):
    action_space = gym.spaces.MultiDiscrete([2, 3])


def make_echo_env() -> gym.Env:
    return EchoEnv()


def make_dict_obs_env() -> gym.Env:
    return DictObsEnv()


def make_not_an_env() -> object:
    return object()


class TwoChoiceBandit(gym.Env):
    """Two independent choices per step (MultiDiscrete [3, 4], the first starting at 1): reward 1 for choosing 3 in
    the first and 1 for choosing 2 in the second; episodes of 8 steps (a random policy earns about 4.7)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 4], start=[1, 0])

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray):
        assert action in self.action_space, action
        self.t += 1
        return np.zeros(2, np.float32), float(action[0] == 3) + float(action[1] == 2), False, self.t >= 8, {}


class ChannelsLastImages(gym.Env):
    """(H, W, C) uint8 frames whose pixel (y, x, c) is y + 2x + 50c + t, t the step; reward 0; episodes of 3 steps."""

    def __init__(self, channels: int = 3, size: int = 40) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=(size, size + 4, channels), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        y, x, c = np.indices(self.observation_space.shape)
        return ((y + 2 * x + 50 * c + self.t) % 256).astype(np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= 3, {}


class NoisyFrames(ChannelsLastImages):
    """ChannelsLastImages' frames and episodes, but uniform noise except pixel (0, 0, c), always 10 + 50c."""

    def _obs(self) -> np.ndarray:
        frame = self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)
        frame[0, 0] = 10 + 50 * np.arange(frame.shape[2])
        return frame
