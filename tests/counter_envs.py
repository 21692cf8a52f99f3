"""Counting envs for tests/test_serial.py's checks of the slots' bookkeeping, loaded by name
(`--env tests.counter_envs:<callable>`): `make_next_step_counters`, a VectorEnv in gymnasium's NEXT_STEP autoreset
mode; `make_raising_counter`, an env whose first instance in the process to reach step 5 raises there (once);
`make_raising_vector`, a VectorEnv of those, whose backend cannot replace one env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


class Counter(gym.Env):
    """Episodes of exactly `length` steps; observes (its step count, the last action). The first instance of the
    process to reach step `raise_at` raises there (once in the process)."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    raised = False

    def __init__(self, length: int = 3, raise_at: int = 0) -> None:
        self.length, self.raise_at, self.t = length, raise_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == self.raise_at and not Counter.raised:
            Counter.raised = True
            raise RuntimeError("simulator crashed")
        return np.array([self.t, action], np.float32), 1.0, self.t == self.length, False, {}


def make_next_step_counters(num_envs: int = 2) -> gym.vector.VectorEnv:
    """A VectorEnv in gymnasium's default autoreset mode: the step after an episode's end is its reset."""
    return gym.vector.SyncVectorEnv([Counter for _ in range(num_envs)], autoreset_mode=AutoresetMode.NEXT_STEP)


def raise_once_again() -> None:
    """Re-arm `Counter`'s one raise (the env registry imports this module as `tests.counter_envs`, as the tests do)."""
    Counter.raised = False


def make_raising_counter() -> gym.Env:
    return Counter(length=1000, raise_at=5)


def make_raising_vector(num_envs: int = 2) -> gym.vector.VectorEnv:
    """A VectorEnv whose step raises once: the backend cannot replace one of its envs."""
    return gym.vector.SyncVectorEnv([make_raising_counter for _ in range(num_envs)])
