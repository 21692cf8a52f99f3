"""Envs for the env-hook tests, loaded by name (`hook_envs:<callable>`): env metrics and a curriculum."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_LEN = 10


class RightSteps(gym.Env):
    """Ten steps of choosing left (0) or right (1); each right pays 1. Reports its metrics the two ways asyncrl
    reads: `info["rights"]` at every step (for `--info-keys rights`) and `info["episode_extra_stats"]` at the end.

    A curriculum too: `set_training_info` sets `level` to the run's recent mean return (rounded down), so the
    level follows the learned policy; it is reported as the `level` metric, and `training_infos` counts the calls.
    """

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, text_metric: bool = False) -> None:
        self.text_metric = text_metric  # a bad env: reports a string where --info-keys expects a number
        self.level, self.training_infos = 0, 0
        self.t = self.rights = 0

    def set_training_info(self, info: dict) -> None:
        self.training_infos += 1
        ret = info["episode_return_mean"]
        if ret is not None:
            self.level = int(ret)

    def _obs(self) -> np.ndarray:
        return np.array([self.t / EPISODE_LEN, self.level / EPISODE_LEN], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = self.rights = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.rights += int(action)
        done = self.t >= EPISODE_LEN
        info: dict = {"rights": "many" if self.text_metric else self.rights}
        if done:
            info["episode_extra_stats"] = {"right_share": self.rights / self.t, "level": self.level,
                                           "training_infos": self.training_infos}
        return self._obs(), float(action), done, False, info


def make_right_steps(text_metric: bool = False) -> gym.Env:
    return RightSteps(text_metric)
