"""The tanh-squashed Gaussian of SAC's actor: its log-density at a pre-squash sample (Haarnoja et al. 2018,
"Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905, appendix C eq. 21). Pure tensor maths."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_2 = math.log(2.0)


def tanh_log_det_jacobian(pre_tanh: torch.Tensor) -> torch.Tensor:
    """`sum_i log(1 - tanh(u_i)^2)`, in the stable form `2 (log 2 - u - softplus(-2u))`, summed over the last dim."""
    return (2.0 * (LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(dim=-1)


def tanh_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, pre_tanh: torch.Tensor,
                           scale: torch.Tensor | None = None) -> torch.Tensor:
    """log-density of `a = bias + scale * tanh(u)`, u ~ N(mean, exp(log_std)), at pre-squash `u` (appendix C)."""
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=-1)
    logp = gaussian - tanh_log_det_jacobian(pre_tanh)
    if scale is not None:
        logp = logp - torch.log(scale).sum(dim=-1)
    return logp
