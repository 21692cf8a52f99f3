"""The generic backend: a Python loop over gymnasium envs with same-step auto-reset."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from asyncrl.envs.base import EnvError, EnvSpec, EpisodeStats, VecEnv

SUPPORTED = "asyncrl supports Box observation spaces and Discrete or 1-D Box action spaces"


def gym_env_spec(name: str, env: gym.Env) -> EnvSpec:
    """Check `env`'s spaces and describe it; raises EnvError for unsupported spaces."""
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise EnvError(f"env {name!r} has a {type(obs_space).__name__} observation space; {SUPPORTED}")
    box_action = isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1
    if not (isinstance(act_space, gym.spaces.Discrete) or box_action):
        raise EnvError(f"env {name!r} has a {act_space} action space; {SUPPORTED}")
    dtype = np.dtype(np.float32) if np.issubdtype(obs_space.dtype, np.floating) else np.dtype(obs_space.dtype)
    return EnvSpec(name, tuple(obs_space.shape), dtype, act_space, frameskip=1)


class GymVecEnv(VecEnv):
    """`num_envs` envs made by `factory`, stepped one after another in this process."""

    def __init__(self, name: str, factory: Callable[[], gym.Env], num_envs: int) -> None:
        self.num_envs = num_envs
        first = factory()
        try:
            self.spec = gym_env_spec(name, first)
        except EnvError:
            first.close()
            raise
        self.envs = [first] + [factory() for _ in range(num_envs - 1)]
        space = self.spec.action_space
        if self.spec.discrete:
            self._start = int(space.start)
        else:
            self._low, self._high = space.low, space.high
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        for i, env in enumerate(self.envs):
            obs_out[i], _ = env.reset(seed=seed + i)
        self._ret[:] = 0.0
        self._len[:] = 0

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        if self.spec.discrete:
            acts = [int(a) + self._start for a in actions]
        else:
            acts = list(np.clip(actions, self._low, self._high).astype(self.spec.action_space.dtype))
        stats: list[EpisodeStats] = []
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(acts[i])
            reward = float(reward)
            reward_out[i] = reward
            self._ret[i] += reward
            self._len[i] += 1
            cut = bool(truncated and not terminated)
            terminated_out[i] = bool(terminated)
            truncated_out[i] = cut
            if terminated or truncated:
                stats.append(EpisodeStats(float(self._ret[i]), int(self._len[i]), cut))
                self._ret[i] = 0.0
                self._len[i] = 0
                if cut:
                    final_obs_out[i] = obs
                obs, _ = env.reset()
            obs_out[i] = obs
        return stats

    def close(self) -> None:
        for env in self.envs:
            env.close()
