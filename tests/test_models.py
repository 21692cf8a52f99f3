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


def test_precision_auto_uses_bf16_only_for_the_cnn_on_a_native_bf16_cpu() -> None:
    from asyncrl.runtime.host.devices import cpu_has_native_bf16, resolve_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("fp32", cpu, True) is None
    assert resolve_precision("bf16", cpu, False) is torch.bfloat16
    assert resolve_precision("auto", cpu, False) is None  # MLPs: bf16 would only add casts
    assert resolve_precision("auto", cuda, True) is None
    expected = torch.bfloat16 if cpu_has_native_bf16() else None
    assert resolve_precision("auto", cpu, True) is expected


def test_bf16_encoder_matches_float32_and_keeps_float32_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    spec = _spec(gym.spaces.Discrete(6), (4, 84, 84))
    model = build_model(spec)
    with torch.no_grad():
        model.policy_head.weight.mul_(100)  # logits of order 1, so the comparison means something
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    logits32, values32 = model(obs)
    model.compute_dtype = torch.bfloat16
    logits16, values16 = model(obs)
    assert logits16.dtype == values16.dtype == torch.float32
    assert torch.allclose(logits16, logits32, atol=0.05, rtol=0.05)
    assert torch.allclose(values16, values32, atol=0.05, rtol=0.05)
    (logits16.logsumexp(-1).mean() + values16.square().mean()).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    actions, logp = model.act(obs)
    assert logp.dtype == torch.float32 and actions.shape == (16,)
