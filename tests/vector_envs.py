"""Numpy VectorEnvs for the batched backend, loaded by name (`--env tests.vector_envs:<callable>`).

`CodedVectorEnv` encodes where each transition came from: env i's observation is [i, episode, step-in-episode],
its reward for the step that reaches step s of an episode is 100 * i + s, its episodes last 3 + i steps and end
alternately by termination (even episodes) and by a time-limit truncation (odd ones). Any autoreset mode.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space


def episode_length(env: int) -> int:
    return 3 + env


class CodedVectorEnv(gym.vector.VectorEnv):
    def __init__(self, num_envs: int = 4, autoreset_mode: str = "NextStep") -> None:
        self.num_envs = num_envs
        self.metadata = {"autoreset_mode": AutoresetMode(autoreset_mode)}
        self.single_observation_space = gym.spaces.Box(0.0, 1e6, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.index = np.arange(num_envs)
        self.length = episode_length(self.index)
        self.episode = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.pending = np.zeros(num_envs, bool)  # NEXT_STEP: reset on the next step

    def _obs(self) -> np.ndarray:
        return np.stack([self.index, self.episode, self.t], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        mask = np.ones(self.num_envs, bool) if not options else np.asarray(options["reset_mask"])
        self.episode[mask] = np.where(self.t[mask] > 0, self.episode[mask] + 1, self.episode[mask])
        self.t[mask] = 0
        self.pending[mask] = False
        return self._obs(), {}

    def step(self, actions):
        actions = np.asarray(actions)
        assert actions.shape == (self.num_envs,) and np.isin(actions, (0, 1)).all(), actions
        mode = self.metadata["autoreset_mode"]
        reward = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        resetting = self.pending.copy()
        if mode is AutoresetMode.NEXT_STEP and resetting.any():
            self.episode[resetting] += 1
            self.t[resetting] = 0
            self.pending[resetting] = False
        go = ~resetting
        self.t[go] += 1
        reward[go] = 100 * self.index[go] + self.t[go]
        ended = go & (self.t == self.length)
        terminated[ended] = self.episode[ended] % 2 == 0
        truncated[ended] = self.episode[ended] % 2 == 1
        info: dict = {}
        if mode is AutoresetMode.NEXT_STEP:
            self.pending |= ended
        elif mode is AutoresetMode.SAME_STEP and ended.any():
            final = np.full(self.num_envs, None, dtype=object)
            reached = self._obs()
            for i in np.flatnonzero(ended):
                final[i] = reached[i]
            info = {"final_obs": final, "_final_obs": ended.copy()}
            self.episode[ended] += 1
            self.t[ended] = 0
        return self._obs(), reward, terminated, truncated, info


def coded(num_envs: int, autoreset_mode: str = "NextStep") -> CodedVectorEnv:
    return CodedVectorEnv(num_envs, autoreset_mode)


def three_envs(autoreset_mode: str = "NextStep") -> CodedVectorEnv:
    """Always 3 envs, whatever the run asks for (no num_envs argument)."""
    return CodedVectorEnv(3, autoreset_mode)


def not_an_env() -> object:
    return [1, 2, 3]
