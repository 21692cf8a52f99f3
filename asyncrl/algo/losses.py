"""Masked loss terms and diagnostics for APPO (PPO-style clipped surrogate on V-trace advantages).

Every function takes a ``mask`` (bool or float, same shape as the inputs, or ``None`` for "all
valid"). Masked-out samples contribute nothing -- not even NaN/inf values stored there, in the
forward or the backward pass -- and means are taken over the unmasked samples (a float mask acts
as per-sample weights). An all-zero mask yields 0, never NaN.

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (eq. 7 for the
clipped surrogate); Schulman 2020, "Approximating KL Divergence" (the k3 estimator).
"""

from __future__ import annotations

import torch

__all__ = [
    "approx_kl",
    "clip_fraction",
    "clipped_surrogate_loss",
    "entropy_bonus",
    "masked_mean",
    "normalize_advantages",
    "value_loss",
]


def _weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Float weights broadcast to ``like``'s shape (ones when ``mask`` is None)."""
    if mask is None:
        return torch.ones_like(like)
    return mask.to(like.dtype).expand_as(like)


def _zero_masked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Replace masked-out entries by 0 so garbage there cannot leak NaN into values or gradients."""
    return torch.where(w > 0, x, torch.zeros_like(x))


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted mean ``sum(w * x) / sum(w)`` over unmasked entries; 0 when nothing is unmasked."""
    w = _weights(mask, x)
    total = (_zero_masked(x, w) * w).sum()
    denom = w.sum()
    # A safe denominator keeps both the value and the gradient finite when the mask is empty
    # (the numerator is then exactly 0).
    safe_denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    return total / safe_denom


def _log_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``log(pi/mu)`` with masked entries set to 0 (ratio 1) before any exp is taken."""
    return _zero_masked(logp - behaviour_logp, w)


def clipped_surrogate_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Negated PPO clipped objective (Schulman et al. 2017, eq. 7), a loss to minimise.

    ``-mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))`` with ``r = exp(logp - behaviour_logp)``.
    Gradients flow through ``logp`` only in the usual way; ``advantages`` should be detached.
    """
    w = _weights(mask, logp)
    ratio = torch.exp(_log_ratio(logp, behaviour_logp, w))
    adv = _zero_masked(advantages, w)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    return -masked_mean(torch.minimum(unclipped, clipped), w)


def value_loss(values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Squared-error critic loss ``0.5 * mean((V(x_s) - v_s)^2)`` (V-trace targets, IMPALA sec. 4.2)."""
    w = _weights(mask, values)
    diff = _zero_masked(values - targets, w)
    return 0.5 * masked_mean(diff.square(), w)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean policy entropy; the caller subtracts ``coeff * entropy_bonus`` from the loss."""
    return masked_mean(entropy, mask)


def approx_kl(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """k3 estimator of ``KL(mu || pi)`` from actions sampled by ``mu``: ``mean((r - 1) - log r)``.

    Unbiased (``E_mu[r - 1] = 0``) and non-negative per sample since ``log r <= r - 1``.
    Wrap in ``torch.no_grad()`` when used only as a diagnostic.
    """
    w = _weights(mask, logp)
    log_r = _log_ratio(logp, behaviour_logp, w)
    return masked_mean(torch.expm1(log_r) - log_r, w)


def clip_fraction(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    clip_ratio: float,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fraction of unmasked samples whose ratio lies outside ``[1 - eps, 1 + eps]`` (detached)."""
    with torch.no_grad():
        w = _weights(mask, logp)
        ratio = torch.exp(_log_ratio(logp, behaviour_logp, w))
        outside = ((ratio - 1.0).abs() > clip_ratio).to(w.dtype)
        return masked_mean(outside, w)


def normalize_advantages(
    adv: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """Standardise advantages with the (weighted) mean and population std of unmasked entries.

    Advantages are constants of the policy-gradient loss, so the result is detached.
    Masked-out entries are returned as 0.
    """
    with torch.no_grad():
        w = _weights(mask, adv)
        mean = masked_mean(adv, w)
        centred = _zero_masked(adv - mean, w)
        var = masked_mean(centred.square(), w)
        return centred / (var.sqrt() + eps)
