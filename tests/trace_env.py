"""A gymnasium env whose observations say where they came from, for checking the data path slot by slot.

Observation `[pid, instance, t, last_action]`: the process and the per-process instance number identify the
env, `t` counts steps since its reset, `last_action` is the action just applied (-1 after a reset). The reward
is the action itself; episodes last `EPISODE_LEN` steps. Loaded by name: `trace_env:make_trace_env`.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import gymnasium as gym
import numpy as np

EPISODE_LEN = 7
_instances = itertools.count()


class TraceEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 2.0**22, shape=(4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.instance = next(_instances)
        self.t = 0

    def _obs(self, action: int) -> np.ndarray:
        return np.array([os.getpid(), self.instance, self.t, action], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(-1), {}

    def step(self, action):
        self.t += 1
        return self._obs(int(action)), float(action), self.t >= EPISODE_LEN, False, {}


def make_trace_env() -> gym.Env:
    return TraceEnv()
