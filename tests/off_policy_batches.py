"""A small off-policy learner (--algo sac, td3 or redq) on Pendulum-v1 and random batches of T x B steps for it, built
in this process (tests/test_off_policy_learners.py, tests/test_q_divergence.py)."""

from __future__ import annotations

import torch

from asyncrl.agents import registry
from asyncrl.agents.batch import Batch
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec

T, B = 4, 3
SPEC = make_env_spec("Pendulum-v1")


def make_learner(algo: str, **overrides) -> OffPolicyLearner:
    settings = {"env": "Pendulum-v1", "algo": algo, "rollout": T, "replay_size": 1000, "learning_starts": 0,
                "sac_batch_size": 16, "hidden_size": 32, "utd": 1.0, **overrides}
    return registry.make_learner(Config(**settings).resolve(), SPEC, torch.device("cpu"))


def make_batch(seed: int = 0, lag: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(T + 1, B, 3, generator=g), actions=torch.rand(T, B, 1, generator=g) * 4 - 2,
        behaviour_logp=torch.zeros(T, B), rewards=torch.randn(T, B, generator=g),
        terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
        final_obs=torch.zeros(B, 3), final_step=torch.full((B,), -1), lag=torch.full((T, B), lag),
        valid=torch.ones(T, B, dtype=torch.bool))
