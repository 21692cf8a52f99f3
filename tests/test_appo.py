"""The APPO objective: V-trace targets wired into the PPO surrogate, value loss and entropy bonus."""

from __future__ import annotations

import torch

from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.algo.vtrace import vtrace


def _batch(t: int = 6, b: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(t, b, generator=g).mul(0.1).sub(1.0).requires_grad_()
    behaviour = logp.detach() + torch.randn(t, b, generator=g) * 0.05
    values = torch.randn(t + 1, b, generator=g).requires_grad_()
    rewards = torch.randn(t, b, generator=g)
    dones = (torch.rand(t, b, generator=g) < 0.2).float()
    entropy = torch.rand(t, b, generator=g).requires_grad_()
    return logp, entropy, values, behaviour, rewards, dones


def test_value_loss_uses_vtrace_targets_with_bootstrap() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch()
    hp = APPOHyperparams(gamma=0.9, normalize_advantages=False)
    mask = torch.ones_like(rewards)
    _, stats = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, hp)
    ref = vtrace(behaviour, logp.detach(), rewards, values[:-1].detach(), values[-1].detach(), 0.9 * (1 - dones))
    expected = 0.5 * (values[:-1].detach() - ref.vs).square().mean()
    assert torch.allclose(stats["value_loss"], expected, atol=1e-6)


def test_total_loss_combines_terms_with_coefficients() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch(seed=1)
    hp = APPOHyperparams(value_coeff=0.25, entropy_coeff=0.1)
    mask = torch.ones_like(rewards)
    loss, stats = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, hp)
    expected = stats["policy_loss"] + 0.25 * stats["value_loss"] - 0.1 * stats["entropy"]
    assert torch.allclose(loss.detach(), expected, atol=1e-6)


def test_masked_samples_get_no_gradient() -> None:
    logp, entropy, values, behaviour, rewards, dones = _batch(seed=2)
    mask = torch.ones_like(rewards)
    mask[:, 0] = 0.0  # a stale env column
    loss, _ = appo_loss(logp, entropy, values, behaviour, rewards, dones, mask, APPOHyperparams())
    loss.backward()
    assert torch.all(logp.grad[:, 0] == 0) and torch.all(entropy.grad[:, 0] == 0)
    assert torch.all(values.grad[:-1, 0] == 0)
    assert logp.grad[:, 1:].abs().sum() > 0


def test_positive_advantage_raises_action_probability() -> None:
    t, b = 1, 1
    logp = torch.full((t, b), -1.0, requires_grad=True)
    behaviour = torch.full((t, b), -1.0)
    values = torch.zeros(t + 1, b, requires_grad=True)
    rewards = torch.ones(t, b)  # better than V = 0: advantage +1
    hp = APPOHyperparams(normalize_advantages=False, entropy_coeff=0.0)
    loss, _ = appo_loss(logp, torch.zeros(t, b), values, behaviour, rewards, torch.ones(t, b),
                        torch.ones(t, b), hp)
    loss.backward()
    assert logp.grad.item() < 0  # gradient descent increases log pi(a|s)
