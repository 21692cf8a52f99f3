"""A two-agent cooperation task in PettingZoo's ParallelEnv API (without pettingzoo): both agents see the same
random signal in 0..2 (one-hot) and their own id (one-hot); both get +1 when both pick the signal. 25 steps an
episode, so a return runs from about 25/9 (random) to 25 (solved).

`asyncrl-train --env examples.coop_signal:make --num-policies 1` trains one shared policy for both agents (two
env columns of one env); `--num-policies 2` one policy per agent. docs/results.md has the runs that keep 25.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SIGNALS, AGENTS, LENGTH = 3, 2, 25


class CoopSignal:
    metadata: dict = {}

    def __init__(self) -> None:
        self.possible_agents = [f"agent_{k}" for k in range(AGENTS)]
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.signal, self.t = 0, 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(0.0, 1.0, (SIGNALS + AGENTS,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(SIGNALS)

    def _obs(self) -> dict[str, np.ndarray]:
        self.signal = int(self.rng.integers(SIGNALS))
        out = {}
        for k, agent in enumerate(self.possible_agents):
            obs = np.zeros(SIGNALS + AGENTS, np.float32)
            obs[self.signal] = obs[SIGNALS + k] = 1.0
            out[agent] = obs
        return out

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        both = all(int(actions[a]) == self.signal for a in self.possible_agents)
        self.t += 1
        done = self.t == LENGTH
        obs = self._obs()
        out = (obs, {a: float(both) for a in self.agents}, {a: False for a in self.agents},
               {a: done for a in self.agents}, {a: {} for a in self.agents})
        if done:
            self.agents = []
        return out

    def close(self) -> None:
        pass


def make() -> CoopSignal:
    return CoopSignal()
