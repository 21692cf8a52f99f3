"""Multi-agent envs for the tests, loaded by name (`--env tests.multi_agent_envs:<callable>`).

`CodedParallelEnv` (PettingZoo's ParallelEnv API, without pettingzoo) encodes where each transition came from:
agent k's observation is [k, episode, step-in-episode], its reward for the step that reaches step s is
100 * k + s, and it leaves the episode after `agent_length(k, episode)` steps (agent 0 first), by termination
in even episodes and truncation in odd ones; the episode ends when the last agent leaves.

`CodedListEnv` is the same game in Sample Factory's multi-agent API (lists, every agent stepping every step,
the env resetting each agent itself), with `info["final_obs"]` at truncations.

`MatchEnv` is a cooperative task that learns in seconds: each of the 3 agents sees a random one-hot cue of 8 and
the team is rewarded for every agent that answers its own cue (1/3 a hit, to every agent); 8 steps an episode,
so returns run from 1 (random) to 8 (solved) per agent. `team=False` rewards each agent for its own answer.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def agent_length(agent: int, episode: int) -> int:
    return 2 + agent + episode % 2


class CodedParallelEnv:
    metadata: dict = {}

    def __init__(self, agents: int = 3, mixed_spaces: bool = False) -> None:
        self.possible_agents = [f"agent_{k}" for k in range(agents)]
        self.agents: list[str] = []
        self._obs_space = gym.spaces.Box(0.0, 1e6, (3,), np.float32)
        self._other = gym.spaces.Box(0.0, 1e6, (4,), np.float32) if mixed_spaces else self._obs_space
        self.episode, self.t = -1, np.zeros(agents, np.int64)

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._other if agent == self.possible_agents[-1] else self._obs_space

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(2)

    def _obs(self, k: int) -> np.ndarray:
        return np.array([k, self.episode, self.t[k]], np.float32)

    def reset(self, seed=None, options=None):
        self.episode += 1
        self.t[:] = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(k) for k, a in enumerate(self.possible_agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        assert set(actions) == set(self.agents), (actions, self.agents)  # never an action for an agent gone
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        for a in list(self.agents):
            k = self.possible_agents.index(a)
            self.t[k] += 1
            obs[a], rewards[a], infos[a] = self._obs(k), float(100 * k + self.t[k]), {}
            done = self.t[k] == agent_length(k, self.episode)
            terms[a], truncs[a] = done and self.episode % 2 == 0, done and self.episode % 2 == 1
            if done:
                self.agents.remove(a)
        return obs, rewards, terms, truncs, infos

    def close(self) -> None:
        pass


class CodedListEnv(gym.Env):
    is_multiagent = True

    def __init__(self, agents: int = 3) -> None:
        self.num_agents = agents
        self.observation_space = gym.spaces.Box(0.0, 1e6, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode = np.zeros(agents, np.int64)
        self.t = np.zeros(agents, np.int64)

    def _obs(self, k: int) -> np.ndarray:
        return np.array([k, self.episode[k], self.t[k]], np.float32)

    def reset(self, seed=None, options=None):
        self.episode[:] = 0
        self.t[:] = 0
        return [self._obs(k) for k in range(self.num_agents)], [{} for _ in range(self.num_agents)]

    def step(self, actions):
        assert len(actions) == self.num_agents
        obs, rewards, terms, truncs, infos = [], [], [], [], []
        for k in range(self.num_agents):
            self.t[k] += 1
            rewards.append(float(100 * k + self.t[k]))
            done = self.t[k] == agent_length(k, int(self.episode[k]))
            odd = self.episode[k] % 2 == 1
            terms.append(bool(done and not odd))
            truncs.append(bool(done and odd))
            infos.append({"final_obs": self._obs(k)} if done else {})
            if done:
                self.episode[k] += 1
                self.t[k] = 0
            obs.append(self._obs(k))
        return obs, rewards, terms, truncs, infos


class MatchEnv:
    """Three agents, each rewarded (as a team) when it answers its own random cue."""

    metadata: dict = {}
    CUES, LENGTH = 8, 8

    def __init__(self, team: bool = True) -> None:
        self.team = team  # False: each agent is rewarded for its own answer only
        self.possible_agents = ["a", "b", "c"]
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.cues = np.zeros(3, np.int64)
        self.t = 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(0.0, 1.0, (self.CUES,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(self.CUES)

    def _obs(self) -> dict:
        self.cues = self.rng.integers(0, self.CUES, 3)
        return {a: np.eye(self.CUES, dtype=np.float32)[c] for a, c in zip(self.possible_agents, self.cues)}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        hit = {a: float(int(actions[a]) == c) for a, c in zip(self.possible_agents, self.cues)}
        self.t += 1
        done = self.t == self.LENGTH
        team = sum(hit.values()) / 3.0
        obs = self._obs()
        out = (obs, {a: team if self.team else hit[a] for a in self.agents}, {a: False for a in self.agents},
               {a: done for a in self.agents}, {a: {} for a in self.agents})
        if done:
            self.agents = []
        return out

    def close(self) -> None:
        pass


class CueDuel:
    """Two players see the same random cue of 8 each round; a player who answers it while the other does not
    scores +1 and the other -1 (zero-sum). 8 rounds: a return above 0 is a win."""

    metadata: dict = {}
    CUES, LENGTH = 8, 8

    def __init__(self) -> None:
        self.possible_agents = ["left", "right"]
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)
        self.cue, self.t = 0, 0

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Box(0.0, 1.0, (self.CUES,), np.float32)

    def action_space(self, agent: str) -> gym.spaces.Space:
        return gym.spaces.Discrete(self.CUES)

    def _obs(self) -> dict:
        self.cue = int(self.rng.integers(0, self.CUES))
        return {a: np.eye(self.CUES, dtype=np.float32)[self.cue] for a in self.possible_agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        left, right = (int(actions[a]) == self.cue for a in self.possible_agents)
        score = float(left) - float(right)
        self.t += 1
        done = self.t == self.LENGTH
        out = (self._obs(), {"left": score, "right": -score}, {a: done for a in self.agents},
               {a: False for a in self.agents}, {a: {} for a in self.agents})
        if done:
            self.agents = []
        return out

    def close(self) -> None:
        pass


def duel() -> CueDuel:
    return CueDuel()


def coded(agents: int = 3) -> CodedParallelEnv:
    return CodedParallelEnv(agents)


def coded_lists(agents: int = 3) -> CodedListEnv:
    return CodedListEnv(agents)


def mixed_spaces() -> CodedParallelEnv:
    return CodedParallelEnv(3, mixed_spaces=True)


def match(team: bool = True) -> MatchEnv:
    return MatchEnv(team)
