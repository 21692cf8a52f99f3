"""A user's env need not have the optional methods of its API: a multi-agent env written without `close()` (the
PettingZoo ParallelEnv API's other methods present, or Sample Factory's list API) trains through `asyncrl-train`
like any other, with no traceback.

The envs are defined here and named as `--env tests.test_user_env_optional_methods:<callable>`.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from asyncrl.diagnostics.metrics import read_metrics
from tests.conftest import run_cli

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


@pytest.mark.parametrize("callable_name", ["parallel_without_close", "list_without_close"])
def test_a_multi_agent_env_without_close_trains(callable_name: str, tmp_path: Path) -> None:
    proc = run_cli(["--env", f"tests.test_user_env_optional_methods:{callable_name}", "--workers", "1",
                    "--envs-per-worker", "4", "--worker-splits", "1", "--rollout", "8", "--batch-size", "32",
                    "--minibatches", "1", "--frames", "1600", "--report-interval", "1", "--experiment", "noclose"],
                   tmp_path, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output and "AttributeError" not in output, output[-3000:]
    records = read_metrics(tmp_path / "noclose")
    assert records and records[-1]["env_steps"] >= 1600
    returns = [r["episode_return_mean"] for r in records if r.get("episode_return_mean") is not None]
    assert returns and all(0.0 <= r <= EPISODE for r in returns), returns
