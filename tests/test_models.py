"""The actor-critic's fast sampling path agrees with torch.distributions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Categorical

from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import build_model, flat_numel


def _spec(action_space: gym.spaces.Space, obs_shape=(4,)) -> EnvSpec:
    dtype = np.uint8 if len(obs_shape) == 3 else np.float32
    return EnvSpec("test", obs_shape, np.dtype(dtype), action_space, 1)


def test_categorical_act_matches_distribution() -> None:
    torch.manual_seed(0)
    model = build_model(_spec(gym.spaces.Discrete(3)))
    with torch.no_grad():
        model.policy_head.weight.mul_(50)  # make the policy far from uniform
    obs = torch.randn(100_000, 4)
    actions, logp = (t.clone() for t in model.act(obs))
    with torch.no_grad():
        dist = Categorical(logits=model(obs)[0])
        assert torch.allclose(dist.log_prob(actions), logp, atol=1e-5)
        expected = dist.probs.mean(0)
    empirical = torch.bincount(actions, minlength=3).float() / len(actions)
    assert torch.allclose(empirical, expected, atol=0.01)


def test_gaussian_act_matches_distribution() -> None:
    torch.manual_seed(0)
    model = build_model(_spec(gym.spaces.Box(-1, 1, (2,))))
    with torch.no_grad():
        model.log_std.fill_(-0.5)
    obs = torch.randn(50_000, 4)
    actions, logp = (t.clone() for t in model.act(obs))
    with torch.no_grad():
        mean = model(obs)[0]
        dist = model.distribution(mean)
        assert torch.allclose(dist.log_prob(actions), logp, atol=1e-4)
    assert torch.allclose((actions - mean).std(0), torch.full((2,), float(np.exp(-0.5))), atol=0.01)


def test_nature_cnn_shapes() -> None:
    model = build_model(_spec(gym.spaces.Discrete(6), (4, 84, 84)))
    out, value = model(torch.zeros(5, 4, 84, 84, dtype=torch.uint8))
    assert out.shape == (5, 6) and value.shape == (5,)
    assert flat_numel(model) > 1_000_000  # 3 conv layers + 512-unit layer
