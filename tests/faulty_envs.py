"""Envs with planted faults, loaded by name (`faulty_envs:<callable>`) in the diagnostics end-to-end tests."""

from __future__ import annotations

import time

import gymnasium as gym

STEP_SLEEP_S = 0.002  # a slow simulator: ~2 ms per step, far above the framework's per-step cost
NAN_AFTER_S = 5.0  # seconds after an env's first step at which its rewards turn NaN


class SlowStep(gym.Wrapper):
    """Sleeps before every step, so stepping the env dominates the rollout workers' time."""

    def step(self, action):
        time.sleep(STEP_SLEEP_S)
        return self.env.step(action)


class NanRewardAfter(gym.Wrapper):
    """Normal rewards for the first `NAN_AFTER_S` seconds of stepping, NaN ever after."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.t_first: float | None = None

    def step(self, action):
        now = time.monotonic()
        self.t_first = now if self.t_first is None else self.t_first
        obs, reward, terminated, truncated, info = self.env.step(action)
        if now - self.t_first >= NAN_AFTER_S:
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def make_slow_cartpole() -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"))


def make_nan_reward_cartpole() -> gym.Env:
    return NanRewardAfter(gym.make("CartPole-v1"))
