"""Multi-agent envs written without `close()` (nor render() or seed()), loaded by name
(`--env tests.no_close_envs:<callable>`) in tests/test_user_env_optional_methods.py: `parallel_without_close`, the
PettingZoo ParallelEnv API's other methods; `list_without_close`, Sample Factory's list API. An agent's reward is
its action, so returns run from 0 to EPISODE."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE = 10  # steps per episode; an agent's reward is its action, so returns run from 0 to EPISODE
AGENTS = 2
OBS_SPACE = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


class ParallelEnvWithoutClose:
    """PettingZoo's ParallelEnv API (possible_agents, agents, observation_space(agent), action_space(agent), reset,
    step) and nothing more: no close(), render() or seed()."""

    metadata: dict = {}

    def __init__(self) -> None:
        self.possible_agents = [f"agent_{k}" for k in range(AGENTS)]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return OBS_SPACE

    def action_space(self, agent: str) -> gym.spaces.Space:
        return ACT_SPACE

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        done = self.t >= EPISODE
        obs = {a: np.full(2, self.t / EPISODE, np.float32) for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        terms = {a: done for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos: dict = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


class ListEnvWithoutClose:
    """Sample Factory's multi-agent API (is_multiagent, num_agents, lists indexed by agent, resetting itself) and
    nothing more: no close()."""

    is_multiagent = True
    num_agents = AGENTS
    observation_space = OBS_SPACE
    action_space = ACT_SPACE

    def __init__(self) -> None:
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[list, list]:
        self.t = 0
        return [np.zeros(2, np.float32)] * AGENTS, [{}] * AGENTS

    def step(self, actions: list) -> tuple[list, list, list, list, list]:
        self.t += 1
        done = self.t >= EPISODE
        rewards = [float(a) for a in actions]
        if done:
            self.t = 0
        obs = [np.full(2, self.t / EPISODE, np.float32)] * AGENTS
        return obs, rewards, [done] * AGENTS, [False] * AGENTS, [{}] * AGENTS


def parallel_without_close() -> ParallelEnvWithoutClose:
    return ParallelEnvWithoutClose()


def list_without_close() -> ListEnvWithoutClose:
    return ListEnvWithoutClose()
