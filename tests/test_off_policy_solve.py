"""SAC, TD3 and REDQ learn: a one-step continuous control task that each solves in a few hundred updates of its
real learner (`registry.make_learner`, the class asyncrl-train's learner process runs), fed as that process
feeds it (`train(batch)` on slots of transitions whose actions the published actor's `act` chose).

The task: an observation x uniform in [-1, 1]^2, one action a in [-1, 1], reward -(a - target(x))^2 with
target(x) = 0.5 x0 - 0.5 x1, and the episode ends (terminated) after that one step. The greedy actor's mean
reward on held-out observations is the score; 0 is perfect.
"""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents import registry
from asyncrl.agents.batch import Batch
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec

SPEC = EnvSpec("one-step", (2,), np.dtype(np.float32), gym.spaces.Box(-1.0, 1.0, (1,), np.float32), 1)
WEIGHTS = torch.tensor([0.5, -0.5])
T, B = 8, 8  # a slot of 8 steps x 8 envs: 64 transitions per train() call
WARMUP_BATCHES, BATCHES = 2, 8  # 128 uniform-random transitions, then 6 batches x 64 steps x utd updates
UTD = {"sac": 1.0, "td3": 1.0, "redq": 2.0}  # REDQ: 768 critic updates, its actor updated every 2nd
# Healthy runs (seeds 0-3 of this setup) scored -0.0016 .. -0.0104. The bar is 3x above the worst of them and
# far below what a policy that ignores the observation can reach: the best constant action (a = 0) scores
# -Var(target) = -1/6 = -0.167, a uniformly random one -(1/3 + 1/6) = -0.5 (both computed below), the untrained
# actor -0.22, and an actor trained on the replay buffer's actions instead of its own -0.15 .. -0.22.
BAR = -0.03


def target(obs: torch.Tensor) -> torch.Tensor:
    return obs @ WEIGHTS


def reward(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return -(action[..., 0] - target(obs)) ** 2


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the learner process on a loaded machine: the same numbers on every run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def held_out() -> torch.Tensor:
    return torch.rand(2000, 2, generator=torch.Generator().manual_seed(99)) * 2 - 1


def score(learner: OffPolicyLearner) -> float:
    obs = held_out()
    with torch.no_grad():
        action, _ = learner.policy_module()(obs)  # the greedy action (the evaluator's and asyncrl-enjoy's)
    return float(reward(obs, action).mean())


def solve(algo: str) -> OffPolicyLearner:
    torch.manual_seed(0)
    cfg = Config(env="Pendulum-v1", algo=algo, rollout=T, replay_size=5000, learning_starts=WARMUP_BATCHES * T * B,
                 sac_batch_size=64, hidden_size=32, lr=3e-3, utd=UTD[algo]).resolve()
    learner = registry.make_learner(cfg, SPEC, torch.device("cpu"))
    actor = learner.policy_module()
    g = torch.Generator().manual_seed(1)
    for _ in range(BATCHES):
        obs = torch.rand(T + 1, B, 2, generator=g) * 2 - 1  # obs[T] is the bootstrap observation (unused here)
        action, logp = actor.act(obs[:T].reshape(-1, 2))  # what the policy workers run on the published actor
        action, logp = action.reshape(T, B, 1), logp.reshape(T, B)
        batch = Batch(obs=obs, actions=action, behaviour_logp=logp, rewards=reward(obs[:T], action),
                      terminated=torch.ones(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
                      final_obs=torch.zeros(B, 2), final_step=torch.full((B,), -1),
                      lag=torch.zeros(T, B, dtype=torch.long), valid=torch.ones(T, B, dtype=torch.bool))
        learner.train(batch, 0)
    return learner


def test_policies_that_ignore_the_observation_score_far_below_the_bar() -> None:
    obs = held_out()
    constant = float(reward(obs, torch.zeros(len(obs), 1)).mean())
    uniform = float(reward(obs, torch.rand(len(obs), 1, generator=torch.Generator().manual_seed(3)) * 2 - 1).mean())
    assert constant == pytest.approx(-1 / 6, abs=0.02) and uniform == pytest.approx(-0.5, abs=0.03)
    assert max(constant, uniform) < 5 * BAR


@pytest.mark.parametrize("algo", ["sac", "td3", "redq"])
def test_the_learner_solves_a_one_step_control_task(algo: str) -> None:
    learner = solve(algo)
    assert learner.updates == round(UTD[algo] * (BATCHES - WARMUP_BATCHES) * T * B)
    assert float(learner.policy_module().warmup) == 0.0
    result = score(learner)
    assert result > BAR, f"{algo}: greedy score {result:.4f} (bar {BAR}; the best constant action scores -0.167)"
