"""Hand-checked tests for the APPO loss terms and the running normalisers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asyncrl.algo.losses import (
    approx_kl,
    clip_fraction,
    clipped_surrogate_loss,
    entropy_bonus,
    masked_mean,
    normalize_advantages,
    value_loss,
)
from asyncrl.algo.normalizers import RunningMeanStd, symexp, symlog

LN = math.log


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# --------------------------------------------------------------------------- surrogate


def test_surrogate_clips_large_ratio_with_positive_advantage() -> None:
    # r = 1.5, eps = 0.2, A = +1: min(1.5 * 1, clip(1.5, 0.8, 1.2) * 1) = min(1.5, 1.2) = 1.2 -> loss -1.2
    loss = clipped_surrogate_loss(t(LN(1.5)), t(0.0), t(1.0), clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(-1.2))


def test_surrogate_keeps_large_ratio_with_negative_advantage() -> None:
    # r = 1.5, A = -1: min(-1.5, -1.2) = -1.5 (pessimistic bound keeps the unclipped term) -> loss 1.5
    loss = clipped_surrogate_loss(t(LN(1.5)), t(0.0), t(-1.0), clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(1.5))


def test_surrogate_small_ratio_cases() -> None:
    # r = 0.5, A = -2: min(0.5 * -2, 0.8 * -2) = min(-1.0, -1.6) = -1.6 -> clipped
    # r = 0.5, A = +2: min(1.0, 1.6) = 1.0 -> unclipped
    # r = 1.1, A = +3 (inside the band): 3.3
    # mean objective = (-1.6 + 1.0 + 3.3) / 3 = 0.9 -> loss -0.9
    logp = t(LN(0.5), LN(0.5), LN(1.1))
    loss = clipped_surrogate_loss(logp, torch.zeros(3), t(-2.0, 2.0, 3.0), clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(-0.9))


def test_surrogate_behaviour_logp_offset() -> None:
    # Only the difference matters: logp = -1 + ln 1.5, behaviour = -1 -> r = 1.5 -> same as above.
    loss = clipped_surrogate_loss(t(-1.0 + LN(1.5)), t(-1.0), t(1.0), clip_ratio=0.2)
    torch.testing.assert_close(loss, torch.tensor(-1.2))


def test_surrogate_gradient_zero_when_clipped() -> None:
    # Clipped sample (r = 1.5, A = +1) has no gradient; unclipped sample (r = 1, A = 2):
    # d/dlogp of -(r * A)/2 = -(r * A)/2 = -1.0 at r = 1.
    logp = t(LN(1.5), 0.0).requires_grad_()
    loss = clipped_surrogate_loss(logp, torch.zeros(2), t(1.0, 2.0), clip_ratio=0.2)
    loss.backward()
    torch.testing.assert_close(logp.grad, t(0.0, -1.0))


def test_surrogate_masking() -> None:
    # Second sample is masked out; it would contribute -1.2 * 100 otherwise.
    # Only the first: r = 1, A = 2 -> objective 2 -> loss -2.
    logp = t(0.0, LN(1.5))
    adv = t(2.0, 100.0)
    for mask in (torch.tensor([True, False]), t(1.0, 0.0)):
        loss = clipped_surrogate_loss(logp, torch.zeros(2), adv, 0.2, mask)
        torch.testing.assert_close(loss, torch.tensor(-2.0))


def test_masked_garbage_does_not_leak_nan() -> None:
    # Padding steps may carry inf/nan; neither the value nor the gradient may become NaN.
    logp = t(0.0, float("inf")).requires_grad_()
    behaviour = t(0.0, float("-inf"))
    adv = t(1.0, float("nan"))
    mask = torch.tensor([True, False])
    loss = clipped_surrogate_loss(logp, behaviour, adv, 0.2, mask)
    loss = loss + approx_kl(logp, behaviour, mask)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-1.0))
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[1] == 0.0
    assert clip_fraction(logp, behaviour, 0.2, mask) == 0.0


# --------------------------------------------------------------------------- all-masked


def test_all_masked_gives_zero_without_nan() -> None:
    logp = t(0.3, -0.2).requires_grad_()
    values = t(1.0, 2.0).requires_grad_()
    entropy = t(0.7, 0.9).requires_grad_()
    zeros = torch.zeros(2)
    for mask in (zeros, zeros.bool()):
        terms = [
            clipped_surrogate_loss(logp, zeros, t(1.0, -1.0), 0.2, mask),
            value_loss(values, t(0.0, 0.0), mask),
            entropy_bonus(entropy, mask),
            approx_kl(logp, zeros, mask),
            clip_fraction(logp, zeros, 0.2, mask),
        ]
        for term in terms:
            assert term.item() == 0.0
        total = sum(terms)
        total.backward()
        for leaf in (logp, values, entropy):
            assert torch.isfinite(leaf.grad).all() and (leaf.grad == 0).all()
            leaf.grad = None
        adv = normalize_advantages(t(1.0, 2.0), mask)
        assert torch.equal(adv, torch.zeros(2))


# --------------------------------------------------------------------------- value / entropy


def test_value_loss_by_hand() -> None:
    # errors 1, -2, 3 -> 0.5 * (1 + 4 + 9) / 3 = 7/3
    loss = value_loss(t(1.0, 0.0, 3.0), t(0.0, 2.0, 0.0))
    torch.testing.assert_close(loss, torch.tensor(7.0 / 3.0))
    # Mask out the error of 3: 0.5 * (1 + 4) / 2 = 1.25
    loss = value_loss(t(1.0, 0.0, 3.0), t(0.0, 2.0, 0.0), t(1.0, 1.0, 0.0))
    torch.testing.assert_close(loss, torch.tensor(1.25))


def test_value_loss_gradient() -> None:
    # d/dv 0.5 * mean((v - target)^2) = (v - target) / N = (1, -2) / 2
    v = t(1.0, 0.0).requires_grad_()
    value_loss(v, t(0.0, 2.0)).backward()
    torch.testing.assert_close(v.grad, t(0.5, -1.0))


def test_entropy_bonus_masked_mean() -> None:
    # (0.5 + 1.5) / 2 = 1.0; the masked 100 is ignored.
    entropy = torch.tensor([[0.5, 100.0], [1.5, 100.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(entropy_bonus(entropy, mask), torch.tensor(1.0))
    torch.testing.assert_close(entropy_bonus(entropy), torch.tensor(202.0 / 4))


def test_float_mask_acts_as_weights() -> None:
    # weights 1 and 3: (1 * 2 + 3 * 6) / 4 = 5
    torch.testing.assert_close(masked_mean(t(2.0, 6.0), t(1.0, 3.0)), torch.tensor(5.0))


# --------------------------------------------------------------------------- KL / clip fraction


def test_approx_kl_zero_when_equal() -> None:
    logp = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    assert approx_kl(logp, logp.clone()).item() == 0.0


def test_approx_kl_by_hand_and_positive() -> None:
    # r = 2: (2 - 1) - ln 2 = 0.306853; r = 0.5: (0.5 - 1) - ln 0.5 = 0.193147; mean = 0.25
    kl = approx_kl(t(LN(2.0), LN(0.5)), torch.zeros(2))
    torch.testing.assert_close(kl, torch.tensor(0.25))
    gen = torch.Generator().manual_seed(1)
    behaviour = torch.randn(100, generator=gen)
    logp = behaviour + 0.1 * torch.randn(100, generator=gen)
    per_sample_positive = [approx_kl(logp[i : i + 1], behaviour[i : i + 1]).item() > 0 for i in range(100)]
    assert all(per_sample_positive)


def test_approx_kl_estimates_true_kl() -> None:
    # Two categorical distributions; sample actions from mu and check k3 against the exact KL(mu||pi).
    mu = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    pi = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = float((mu * (mu / pi).log()).sum())
    actions = torch.multinomial(mu, 200_000, replacement=True, generator=torch.Generator().manual_seed(2))
    est = approx_kl(pi.log()[actions], mu.log()[actions]).item()
    assert est == pytest.approx(exact, rel=0.02)


def test_clip_fraction_by_hand() -> None:
    # ratios 1.5 (out), 0.7 (out), 1.1 (in), 0.85 (in); last one masked -> 2 of 3 outside.
    logp = t(LN(1.5), LN(0.7), LN(1.1), LN(0.85))
    frac = clip_fraction(logp, torch.zeros(4), 0.2)
    torch.testing.assert_close(frac, torch.tensor(0.5))
    frac = clip_fraction(logp, torch.zeros(4), 0.2, t(1.0, 1.0, 1.0, 0.0))
    torch.testing.assert_close(frac, torch.tensor(2.0 / 3.0))
    assert not frac.requires_grad


# --------------------------------------------------------------------------- advantage normalisation


def test_normalize_advantages_by_hand() -> None:
    # unmasked 1, 2, 3: mean 2, population std sqrt(2/3) -> (-1, 0, 1) / 0.816497; masked entry -> 0
    adv = t(1.0, 2.0, 3.0, 50.0)
    out = normalize_advantages(adv, t(1.0, 1.0, 1.0, 0.0))
    s = math.sqrt(2.0 / 3.0)
    torch.testing.assert_close(out, t(-1.0 / s, 0.0, 1.0 / s, 0.0))


def test_normalize_advantages_statistics() -> None:
    adv = torch.randn(32, 8, generator=torch.Generator().manual_seed(3)) * 5.0 + 3.0
    out = normalize_advantages(adv)
    assert abs(out.mean().item()) < 1e-5
    assert out.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)


def test_the_std_floor_keeps_small_advantages_small_and_large_ones_standardised() -> None:
    """--adv-std-floor: advantages whose std is under the floor (a learned task's noise) are centred, not scaled
    up; above it they are standardised as before."""
    noise = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 0.01
    small = normalize_advantages(noise, std_floor=1.0)
    assert small.std(unbiased=False).item() == pytest.approx(0.01, rel=0.1)
    assert normalize_advantages(noise).std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)  # no floor
    large = normalize_advantages(noise * 1000.0, std_floor=1.0)
    assert large.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_normalize_constant_advantages_is_finite() -> None:
    out = normalize_advantages(torch.full((4,), 7.0))
    assert torch.equal(out, torch.zeros(4))


# --------------------------------------------------------------------------- RunningMeanStd


def test_running_mean_std_matches_numpy_over_chunks() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(loc=[1.0, -3.0, 10.0], scale=[0.5, 2.0, 7.0], size=(1000, 3))
    rms = RunningMeanStd(shape=(3,), eps=1e-4)
    for chunk in np.array_split(data, [1, 3, 100, 101, 450, 999]):  # includes 1-row chunks
        rms.update(torch.as_tensor(chunk, dtype=torch.float32))
    # The eps pseudo-count (mean 0, var 1) perturbs the result by ~1e-7 relative.
    np.testing.assert_allclose(rms.mean.numpy(), data.astype(np.float32).mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rms.var.numpy(), data.astype(np.float32).var(axis=0), rtol=1e-5, atol=1e-5)
    assert rms.count.item() == pytest.approx(1000 + 1e-4)


def test_running_mean_std_flattens_leading_dims() -> None:
    rng = np.random.default_rng(1)
    data = rng.normal(size=(6, 4, 2))  # [T, B, feature]
    rms = RunningMeanStd(shape=2, eps=1e-12)
    rms.update(torch.as_tensor(data))
    flat = data.reshape(-1, 2)
    np.testing.assert_allclose(rms.mean.numpy(), flat.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(rms.var.numpy(), flat.var(axis=0), rtol=1e-9)


def test_running_mean_std_merge_equals_joint_update() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(2.0, 3.0, size=(300,)), rng.normal(-1.0, 0.5, size=(700,))
    joint = RunningMeanStd(eps=1e-4)
    joint.update(torch.as_tensor(np.concatenate([a, b])))
    left, right = RunningMeanStd(eps=1e-4), RunningMeanStd(eps=1e-4)
    left.update(torch.as_tensor(a))
    right.update(torch.as_tensor(b))
    # Merge right's statistics into left, as a data-parallel learner would.
    left.merge(right.mean, right.var, right.count)
    torch.testing.assert_close(left.mean, joint.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(left.var, joint.var, rtol=1e-6, atol=1e-6)


def test_running_mean_std_normalize_and_clip() -> None:
    rms = RunningMeanStd(shape=(), eps=1e-4)
    rms.load_state_dict(
        {
            "mean": torch.tensor(2.0, dtype=torch.float64),
            "var": torch.tensor(4.0, dtype=torch.float64),
            "count": torch.tensor(10.0, dtype=torch.float64),
        }
    )
    # (x - 2) / sqrt(4 + 1e-8): 4 -> 1.0; 100 -> 49 -> clipped to 5; -100 -> -51 -> clipped to -5
    x = t(4.0, 100.0, -100.0)
    out = rms.normalize(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, t(1.0, 5.0, -5.0))
    torch.testing.assert_close(rms.normalize(x, clip=None), t(1.0, 49.0, -51.0))
    torch.testing.assert_close(rms.denormalize(rms.normalize(x, clip=None)), x)


def test_running_mean_std_state_dict_round_trip() -> None:
    rms = RunningMeanStd(shape=(2,))
    rms.update(torch.randn(50, 2, generator=torch.Generator().manual_seed(4)) * 3 + 1)
    state = {k: v.clone() for k, v in rms.state_dict().items()}
    assert set(state) == {"mean", "var", "count"}
    fresh = RunningMeanStd(shape=(2,))
    fresh.load_state_dict(state)
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(fresh, name), getattr(rms, name))
    x = torch.randn(7, 2)
    torch.testing.assert_close(fresh.normalize(x), rms.normalize(x))
    # Later updates to the original must not alias the loaded copy.
    rms.update(torch.ones(5, 2))
    assert not torch.equal(fresh.count, rms.count)


def test_running_mean_std_rejects_wrong_shape() -> None:
    rms = RunningMeanStd(shape=(3,))
    with pytest.raises(ValueError):
        rms.update(torch.zeros(4, 2))


# --------------------------------------------------------------------------- symlog / symexp


def test_symlog_values_and_inverse() -> None:
    # symlog(e - 1) = ln(e) = 1; symlog(-(e - 1)) = -1; symlog(0) = 0
    x = torch.tensor([math.e - 1.0, -(math.e - 1.0), 0.0], dtype=torch.float64)
    torch.testing.assert_close(symlog(x), torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
    y = torch.linspace(-1e4, 1e4, 2001, dtype=torch.float64)
    torch.testing.assert_close(symexp(symlog(y)), y)
    z = torch.linspace(-8.0, 8.0, 101, dtype=torch.float64)
    torch.testing.assert_close(symlog(symexp(z)), z)
