"""A near-free env for measuring the framework's own overhead."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from asyncrl.envs.base import EnvSpec, EpisodeStats, VecEnv

EPISODE_LEN = 100
NULL_SPEC = EnvSpec(
    name="null",
    obs_shape=(4,),
    obs_dtype=np.dtype(np.float32),
    action_space=gym.spaces.Discrete(2),
    frameskip=1,
)


class NullVecEnv(VecEnv):
    """Constant observations, reward 1.0 per step, every episode exactly `EPISODE_LEN` steps (a termination)."""

    spec = NULL_SPEC

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self._t = np.zeros(num_envs, dtype=np.int64)

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        obs_out[:] = 0.0
        self._t[:] = 0

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        self._t += 1
        done = self._t >= EPISODE_LEN
        obs_out[:] = 0.0
        reward_out[:] = 1.0
        terminated_out[:] = done
        truncated_out[:] = False
        n_done = int(np.count_nonzero(done))
        if n_done == 0:
            return []
        self._t[done] = 0
        return [EpisodeStats(float(EPISODE_LEN), EPISODE_LEN) for _ in range(n_done)]


def backend_spec(name: str) -> EnvSpec:
    """The registry's `null` row: the spec."""
    return NULL_SPEC


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None) -> VecEnv:
    """The registry's `null` row: `num_envs` envs."""
    return NullVecEnv(num_envs)
