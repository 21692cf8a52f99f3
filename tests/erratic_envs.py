"""Envs whose simulator raises, loaded by name (`--env tests.erratic_envs:<callable>`) in test_env_recovery.py."""

from __future__ import annotations

import gymnasium as gym

RAISE_EVERY = 500  # steps per env instance between two errors of the flaky env


class RaiseEvery(gym.Wrapper):
    """Raises at every `every`-th step of this instance (the step is lost, as when a simulator crashes)."""

    def __init__(self, env: gym.Env, every: int) -> None:
        super().__init__(env)
        self.every, self.steps = every, 0

    def step(self, action):
        self.steps += 1
        if self.steps % self.every == 0:
            raise RuntimeError(f"simulator crashed at step {self.steps}")
        return self.env.step(action)


def make_flaky_cartpole() -> gym.Env:
    return RaiseEvery(gym.make("CartPole-v1"), RAISE_EVERY)


def make_crashing_cartpole() -> gym.Env:
    return RaiseEvery(gym.make("CartPole-v1"), 1)
