"""Masked loss terms and diagnostics for APPO (PPO-style clipped surrogate on V-trace advantages).

Every function takes a ``mask`` (bool or float, same shape as the inputs, or ``None`` for "all
valid"). Masked-out samples contribute nothing -- not even NaN/inf values stored there, in the
forward or the backward pass -- and means are taken over the unmasked samples (a float mask acts
as per-sample weights). An all-zero mask yields 0, never NaN.

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (eq. 7 for the
clipped surrogate); Schulman 2020, "Approximating KL Divergence" (the k3 estimator).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Weights",
    "approx_kl",
    "clip_fraction",
    "clipped_surrogate_loss",
    "entropy_bonus",
    "masked_mean",
    "normalize_advantages",
    "value_loss",
]

@dataclass(frozen=True)
class Weights:
    """A mask read once for several masked terms of one minibatch: its float weights, which entries count
    (weight > 0) and the denominator of a mean over them (their total, or 1 when nothing counts). Every function
    here takes one in place of a mask, which spares each term re-deriving them (a loss step's terms are tens of
    small tensor operations each)."""

    w: torch.Tensor
    counted: torch.Tensor
    total: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor | Weights | None, like: torch.Tensor) -> Weights:
        """`mask` (bool or float, `like`'s shape or broadcastable to it; None: all count) as weights."""
        if isinstance(mask, Weights):
            return mask
        w = torch.ones_like(like) if mask is None else mask.to(like.dtype).expand_as(like)
        total = w.sum()
        # A safe denominator keeps both the value and the gradient finite when the mask is empty (the numerator
        # is then exactly 0).
        return cls(w, w > 0, torch.where(total > 0, total, torch.ones_like(total)))

    def zero_masked(self, x: torch.Tensor) -> torch.Tensor:
        """`x` with masked-out entries replaced by 0, so garbage there cannot leak NaN into values or gradients."""
        return torch.where(self.counted, x, 0.0)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """``sum(w * x) / sum(w)`` over the counted entries; 0 when none counts."""
        return (self.zero_masked(x) * self.w).sum() / self.total


def masked_mean(x: torch.Tensor, mask: torch.Tensor | Weights | None = None) -> torch.Tensor:
    """Weighted mean ``sum(w * x) / sum(w)`` over unmasked entries; 0 when nothing is unmasked."""
    return Weights.of(mask, x).mean(x)


def _log_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor, w: Weights) -> torch.Tensor:
    """``log(pi/mu)`` with masked entries set to 0 (ratio 1) before any exp is taken."""
    return w.zero_masked(logp - behaviour_logp)


def clipped_surrogate_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio: float,
    mask: torch.Tensor | Weights | None = None,
) -> torch.Tensor:
    """Negated PPO clipped objective (Schulman et al. 2017, eq. 7), a loss to minimise.

    ``-mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))`` with ``r = exp(logp - behaviour_logp)``.
    Gradients flow through ``logp`` only in the usual way; ``advantages`` should be detached.
    """
    w = Weights.of(mask, logp)
    ratio = torch.exp(_log_ratio(logp, behaviour_logp, w))
    adv = w.zero_masked(advantages)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    return -w.mean(torch.minimum(unclipped, clipped))


def value_loss(values: torch.Tensor, targets: torch.Tensor,
               mask: torch.Tensor | Weights | None = None) -> torch.Tensor:
    """Squared-error critic loss ``0.5 * mean((V(x_s) - v_s)^2)`` (V-trace targets, IMPALA sec. 4.2)."""
    w = Weights.of(mask, values)
    return 0.5 * w.mean(w.zero_masked(values - targets).square())


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | Weights | None = None) -> torch.Tensor:
    """Mean policy entropy; the caller subtracts ``coeff * entropy_bonus`` from the loss."""
    return masked_mean(entropy, mask)


def approx_kl(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor | Weights | None = None
) -> torch.Tensor:
    """k3 estimator of ``KL(mu || pi)`` from actions sampled by ``mu``: ``mean((r - 1) - log r)``.

    Unbiased (``E_mu[r - 1] = 0``) and non-negative per sample since ``log r <= r - 1``.
    Wrap in ``torch.no_grad()`` when used only as a diagnostic.
    """
    w = Weights.of(mask, logp)
    log_r = _log_ratio(logp, behaviour_logp, w)
    return w.mean(torch.expm1(log_r) - log_r)


def clip_fraction(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    clip_ratio: float,
    mask: torch.Tensor | Weights | None = None,
) -> torch.Tensor:
    """Fraction of unmasked samples whose ratio lies outside ``[1 - eps, 1 + eps]`` (detached)."""
    with torch.no_grad():
        w = Weights.of(mask, logp)
        ratio = torch.exp(_log_ratio(logp, behaviour_logp, w))
        return w.mean(((ratio - 1.0).abs() > clip_ratio).to(logp.dtype))


def normalize_advantages(
    adv: torch.Tensor, mask: torch.Tensor | Weights | None = None, eps: float = 1e-8, std_floor: float = 0.0
) -> torch.Tensor:
    """Standardise advantages with the (weighted) mean and population std of unmasked entries; with `std_floor`,
    divide by the std or the floor, whichever is larger, so advantages smaller than the floor (a learned task's
    noise) are not blown up to unit scale (DreamerV3 scales returns by max(1, range) for the same reason).

    Advantages are constants of the policy-gradient loss, so the result is detached.
    Masked-out entries are returned as 0.
    """
    with torch.no_grad():
        w = Weights.of(mask, adv)
        centred = w.zero_masked(adv - w.mean(adv))
        return centred / (w.mean(centred.square()).sqrt().clamp(min=std_floor) + eps)
