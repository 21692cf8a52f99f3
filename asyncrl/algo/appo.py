"""The APPO objective: PPO's clipped surrogate on V-trace advantages, a V-trace value loss, an entropy bonus.

Pure tensor maths on one time-major minibatch; the learner process feeds it model outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.algo.losses import (
    approx_kl,
    clip_fraction,
    clipped_surrogate_loss,
    entropy_bonus,
    normalize_advantages,
    value_loss,
)
from asyncrl.algo.vtrace import vtrace


@dataclass(frozen=True)
class APPOHyperparams:
    gamma: float = 0.99
    clip_ratio: float = 0.1
    value_coeff: float = 0.5
    entropy_coeff: float = 0.01
    rho_bar: float = 1.0
    c_bar: float = 1.0
    normalize_advantages: bool = True


def appo_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    behaviour_logp: torch.Tensor,
    rewards: torch.Tensor,
    dones: torch.Tensor,
    mask: torch.Tensor,
    hp: APPOHyperparams,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and its named terms.

    Shapes: logp, entropy, behaviour_logp, rewards, dones, mask: [T, B]; values: [T + 1, B], the last row
    being V(x_T), the bootstrap value computed by the current network. `mask` zeroes samples that must not
    be trained on (too stale); they still pass through the V-trace recursion, whose importance weights
    correct for them.
    """
    discounts = hp.gamma * (1.0 - dones.float())
    targets = vtrace(
        behaviour_logp=behaviour_logp, target_logp=logp.detach(), rewards=rewards, values=values[:-1].detach(),
        bootstrap_value=values[-1].detach(), discounts=discounts, rho_bar=hp.rho_bar, c_bar=hp.c_bar,
    )
    advantages = targets.pg_advantages
    if hp.normalize_advantages:
        advantages = normalize_advantages(advantages, mask)
    policy = clipped_surrogate_loss(logp, behaviour_logp, advantages, hp.clip_ratio, mask)
    value = value_loss(values[:-1], targets.vs, mask)
    ent = entropy_bonus(entropy, mask)
    loss = policy + hp.value_coeff * value - hp.entropy_coeff * ent
    with torch.no_grad():
        stats = {
            "policy_loss": policy.detach(),
            "value_loss": value.detach(),
            "entropy": ent.detach(),
            "kl": approx_kl(logp.detach(), behaviour_logp, mask),
            "clip_fraction": clip_fraction(logp.detach(), behaviour_logp, hp.clip_ratio, mask),
            "value_target_mean": targets.vs.mean(),
            "importance_ratio_mean": targets.rhos.mean(),
        }
    return loss, stats
