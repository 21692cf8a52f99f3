"""A memory task for the recurrent-policy tests, loaded by name (`memory_envs:make_cue`).

The first observation of an episode shows a cue (left or right); the next ones show nothing but a clock; at
the last step a question flag asks which cue was shown, and answering it pays 1 (a wrong answer pays 0). Only
a policy that carries a state through the episode can answer better than chance (return 0.5); a feed-forward
policy sees the same observation at the question whatever the cue was. Episodes are longer than the tests'
rollouts, so every episode crosses at least one slot boundary.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

CUE_LEN = 12  # steps per episode: the cue at step 0, the question at step CUE_LEN - 1


class CueMemory(gym.Env):
    """obs = [cue is left, cue is right, question, t / CUE_LEN]; Discrete(2) answers (0 left, 1 right)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = CUE_LEN, clock: bool = True) -> None:
        self.length, self.clock = length, clock
        self.t = self.cue = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(4, dtype=np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        obs[2] = float(self.t == self.length - 1)
        obs[3] = self.t / self.length if self.clock else 0.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        done = self.t == self.length - 1
        reward = float(done and int(action) == self.cue)
        self.t += 1
        return self._obs(), reward, done, False, {}


def make_cue(length: int = CUE_LEN, clock: bool = True) -> CueMemory:
    return CueMemory(length, clock)
