"""SAC, TD3 and REDQ maths on hand-computed numbers; the batched critic ensemble, the tanh-Gaussian actor."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from asyncrl.agents.off_policy import redq_loss as redq
from asyncrl.agents.off_policy import sac_loss as sac
from asyncrl.agents.off_policy import td3_loss as td3
from asyncrl.algo.squashed_gaussian import tanh_gaussian_log_prob
from asyncrl.models.critics import EnsembleLinear, QEnsemble, TanhGaussianActor, polyak_update

T = torch.tensor

# three transitions: 0 truncated (time limit), 1 terminated, 2 mid-episode
REWARDS = T([1.0, 1.0, 1.0])
TERMINATED = T([False, True, False])
TRUNCATED = T([True, False, False])  # not an argument of any target: truncated transitions bootstrap


def test_sac_target_bootstraps_truncated_but_not_terminated() -> None:
    next_q = T([[2.0, 5.0, 3.0], [4.0, 1.0, 3.0]])  # min over the two target critics: 2, 1, 3
    next_logp = T([-1.0, 0.5, 0.0])
    y = sac.soft_q_target(REWARDS, TERMINATED, next_q, next_logp, alpha=0.2, gamma=0.9)
    # 1 + 0.9 (2 - 0.2 * -1) = 2.98;   terminated: 1;   1 + 0.9 (3 - 0) = 3.7
    torch.testing.assert_close(y, T([2.98, 1.0, 3.7]))
    assert TRUNCATED[0] and y[0] != REWARDS[0]


def test_sac_critic_actor_and_temperature_losses_by_hand() -> None:
    q = T([[1.0, 2.0], [3.0, 2.0]], requires_grad=True)
    loss, td = sac.critic_loss(q, T([2.0, 2.0]), weights=T([1.0, 0.5]))
    assert loss.item() == pytest.approx(0.5 * (1 + 0) / 2 * 2)  # each critic: 0.5 * mean(w err^2) = 0.25
    torch.testing.assert_close(td, T([1.0, 0.0]))
    q_pi = T([[1.0, 3.0], [2.0, 0.0]])  # min: 1, 0
    assert sac.actor_loss(q_pi, T([-1.0, 2.0]), alpha=0.5).item() == pytest.approx(((-0.5 - 1) + (1 - 0)) / 2)
    assert sac.target_entropy(6) == -6.0
    log_alpha = T(0.0, requires_grad=True)
    # entropy estimate -mean(logp) = -0.5 is above the target -1: alpha must go down (positive gradient)
    loss = sac.temperature_loss(log_alpha, T([-1.0, 2.0]), entropy_target=-1.0)
    loss.backward()
    assert loss.item() == pytest.approx(0.5) and log_alpha.grad.item() == pytest.approx(0.5)


def test_tanh_gaussian_log_prob_by_hand_and_against_torch_distributions() -> None:
    zero = T([[0.0]])
    # u = 0: log N(0; 0, 1) = -0.5 log(2 pi), and tanh'(0) = 1
    assert tanh_gaussian_log_prob(zero, zero, zero).item() == pytest.approx(-0.5 * math.log(2 * math.pi))
    # u = 1: -0.5 - 0.5 log(2 pi) - log(1 - tanh(1)^2)
    hand = -0.5 - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(1) ** 2)
    assert tanh_gaussian_log_prob(zero, zero, T([[1.0]])).item() == pytest.approx(hand)
    # large |u| stays finite where log(1 - tanh^2) would give -inf
    assert torch.isfinite(tanh_gaussian_log_prob(zero, zero, T([[30.0]]))).all()
    mean, log_std, u = T([[0.3, -1.0]]), T([[-0.5, 0.2]]), T([[0.7, -2.0]])
    scale, bias = T([2.0, 0.5]), T([1.0, 0.0])
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(), AffineTransform(bias, scale)])
    expected = dist.log_prob(bias + scale * torch.tanh(u)).sum(-1)
    torch.testing.assert_close(tanh_gaussian_log_prob(mean, log_std, u, scale.expand_as(u)), expected)


def test_td3_smoothing_clipped_double_q_and_delay_by_hand() -> None:
    a = td3.smoothed_target_action(T([0.9, -0.2]), low=-1.0, high=1.0, noise=T([0.7, -0.1]), noise_clip=0.5)
    torch.testing.assert_close(a, T([1.0, -0.3]))  # 0.9 + clip(0.7) = 1.4 -> bound 1;  -0.2 - 0.1
    noisy = td3.smoothed_target_action(torch.zeros(10_000), -1.0, 1.0, noise_std=0.2, noise_clip=0.5,
                                       generator=torch.Generator().manual_seed(0))
    assert noisy.abs().max() <= 0.5 and 0.18 < noisy.std() < 0.2  # clipped: a little under sigma
    next_q = T([[3.0, 2.0, 5.0], [1.0, 4.0, 0.5]])  # min: 1, 2, 0.5
    y = td3.clipped_double_q_target(REWARDS, TERMINATED, next_q, gamma=0.99)
    torch.testing.assert_close(y, T([1.99, 1.0, 1.495]))  # truncated bootstraps; terminated stops
    assert td3.actor_loss(T([1.0, 3.0])).item() == -2.0
    assert [k for k in range(1, 9) if td3.actor_update_due(k, policy_delay=2)] == [2, 4, 6, 8]
    assert not td3.actor_update_due(0)


def test_redq_target_takes_the_min_over_the_drawn_subset() -> None:
    next_q = torch.arange(30.0).reshape(10, 3)  # critic i: 3i, 3i + 1, 3i + 2
    next_q[7, 1] = -5.0
    subset = T([3, 7])
    y = redq.redq_target(REWARDS, TERMINATED, next_q, T([0.0, 0.0, -1.0]), alpha=0.1, gamma=0.5, subset=subset)
    # min over critics 3 and 7: (9, -5, 11);  1 + 0.5 * 9;  terminated: 1;  1 + 0.5 (11 + 0.1)
    torch.testing.assert_close(y, T([5.5, 1.0, 6.55]))
    g = torch.Generator().manual_seed(0)
    pairs = [tuple(sorted(redq.sample_subset(10, 2, g).tolist())) for _ in range(4500)]
    assert all(a != b for a, b in pairs) and len(set(pairs)) == 45  # every one of the C(10, 2) pairs occurs
    q_pi = torch.stack([torch.full((2,), float(i)) for i in range(10)])  # mean over the 10 critics: 4.5
    assert redq.actor_loss(q_pi, T([1.0, 1.0]), alpha=0.5).item() == pytest.approx(0.5 - 4.5)


def test_ensemble_equals_separate_mlps_with_the_same_weights() -> None:
    torch.manual_seed(0)
    obs_dim, act_dim, n = 5, 2, 10
    mlps = [nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
            for _ in range(n)]
    ens = QEnsemble(obs_dim, act_dim, num_critics=n, hidden=(32, 16))
    ens.load_members(mlps)
    obs, act = torch.randn(64, obs_dim), torch.randn(64, act_dim)
    expected = torch.stack([m(torch.cat([obs, act], -1)).squeeze(-1) for m in mlps])
    out = ens(obs, act)
    assert out.shape == (n, 64)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    out.sum().backward()  # and the same gradients
    expected.sum().backward()
    torch.testing.assert_close(ens.layers[0].weight.grad[3], mlps[3][0].weight.grad.T, rtol=1e-4, atol=1e-6)
    members = torch.tensor([7, 2])  # evaluating a subset runs only those critics, with the same result
    torch.testing.assert_close(ens(obs, act, members=members), out[members].detach())
    # so REDQ's target over all N with a subset equals SAC's min-target over that subset's rows alone
    rewards, terminated, logp = torch.randn(64), torch.rand(64) < 0.2, torch.randn(64)
    full = redq.redq_target(rewards, terminated, out.detach(), logp, 0.2, 0.99, members)
    torch.testing.assert_close(full, sac.soft_q_target(rewards, terminated, out[members].detach(), logp, 0.2, 0.99))
    # members start different, with nn.Linear's init range
    w = EnsembleLinear(4, 100, 3).weight
    assert not torch.equal(w[0], w[1]) and w.abs().max() <= 0.1


def test_tanh_gaussian_actor_respects_bounds_and_its_log_prob() -> None:
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, low=[-2.0, 0.0], high=[2.0, 1.0], hidden=(16,))
    action, logp = actor(torch.randn(512, 3))
    assert (action[:, 0].abs() <= 2).all() and ((action[:, 1] >= 0) & (action[:, 1] <= 1)).all()
    assert logp.shape == (512,) and torch.isfinite(logp).all()
    det, _ = actor(torch.zeros(1, 3), deterministic=True)
    again, _ = actor(torch.zeros(1, 3), deterministic=True)
    assert torch.equal(det, again)
    (action.sum() + logp.sum()).backward()  # reparameterised: gradients reach the mean head
    assert actor.mean.weight.grad.abs().sum() > 0


def test_polyak_update() -> None:
    source = QEnsemble(3, 1, num_critics=2, hidden=(4,))
    target = copy.deepcopy(source)
    for p in target.parameters():
        p.data.zero_()
    polyak_update(target, source, tau=0.25)
    for t, s in zip(target.parameters(), source.parameters()):
        torch.testing.assert_close(t, 0.25 * s)
