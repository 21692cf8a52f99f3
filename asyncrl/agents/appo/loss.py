"""The APPO objective: PPO's clipped surrogate on V-trace advantages, a V-trace value loss, an entropy bonus.

Pure tensor maths on one time-major minibatch; the learner process feeds it model outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from asyncrl.algo.losses import (
    Weights,
    approx_kl,
    clip_fraction,
    clipped_surrogate_loss,
    entropy_bonus,
    masked_mean,
    normalize_advantages,
)
from asyncrl.algo.time_limits import episode_end_inputs
from asyncrl.algo.value_transform import ValueTransform
from asyncrl.algo.vtrace import vtrace

IDENTITY = ValueTransform("none")


@dataclass(frozen=True)
class APPOHyperparams:
    gamma: float = 0.99
    clip_ratio: float = 0.1
    value_coeff: float = 0.5
    entropy_coeff: float = 0.01
    rho_bar: float = 1.0
    c_bar: float = 1.0
    normalize_advantages: bool = True
    adv_std_floor: float = 0.0


def appo_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    behaviour_logp: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    mask: torch.Tensor,
    hp: APPOHyperparams,
    *,
    truncated: torch.Tensor | None = None,
    final_values: torch.Tensor | None = None,
    has_final: torch.Tensor | None = None,
    reward_scale: float = 1.0,
    value_transform: ValueTransform = IDENTITY,
    value_offset: float | None = None,
    on_targets: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    anchor_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and its named terms.

    Shapes: logp, entropy, behaviour_logp, rewards, terminated, mask: [T, B]; values: [T + 1, B], the last
    row being V(x_T), the bootstrap value computed by the current network. `mask` zeroes samples that must
    not be trained on (too stale); they still pass through the V-trace recursion, whose importance weights
    correct for them.

    Time limits (`asyncrl.algo.time_limits`): `truncated` [T, B] marks episodes a time limit cut; where
    `has_final`, `final_values` holds V of the observation the env reached there, and the target is
    r + gamma * V(final). A truncation without a final value is masked out (its earlier steps bootstrap
    from V(x_t)). Without `truncated`, no step is a truncation.

    Scaling (`--normalize-returns`, `asyncrl.algo.return_norm`): rewards are divided by `reward_scale`, so
    values and targets are in those units. `value_transform` (`--value-transform`): `values` and
    `final_values` are the value head's outputs, read as V through `value_transform.to_value`, and the value
    loss compares the head with `to_head(v_s)`. `on_targets(v_s, mask)`, if given, receives the V-trace targets
    (detached, [T, B], in scaled units) and the training mask, e.g. to update a ReturnNormalizer.
    `value_offset` (`--center-values`, in scaled units; None: off) is added to every value read from the head for
    the targets; the head then learns the targets minus a new offset, the mean gap between the targets and the
    head's own values, so its error has mean 0 over the minibatch and no step pushes it towards a constant (the
    new offset is `stats["value_offset"]`, for the next step).

    `anchor_logp` (`--clip-reference learner`): [T, B] log-probs of the policy the clipped ratio is taken against
    (and `kl`, `clip_fraction` measured from), in place of `behaviour_logp`; V-trace still uses `behaviour_logp`.
    """
    head = values
    values = value_transform.to_value(values.detach())
    if value_offset is not None:
        values = values + value_offset
    if final_values is not None:
        final_values = value_transform.to_value(final_values.detach()) + (0.0 if value_offset is None else value_offset)
    if reward_scale != 1.0:
        rewards = rewards / reward_scale
    zeros = torch.zeros_like(rewards, dtype=torch.bool)
    truncated = zeros if truncated is None else truncated.bool()
    has_final = zeros if has_final is None else has_final.bool() & truncated
    final_values = torch.zeros_like(rewards) if final_values is None else final_values
    rewards, discounts = episode_end_inputs(rewards, values[:-1], terminated, truncated, final_values, has_final,
                                            hp.gamma)
    unbootstrapped = truncated & ~has_final
    mask = mask * (~unbootstrapped).to(mask.dtype)
    targets = vtrace(
        behaviour_logp=behaviour_logp, target_logp=logp.detach(), rewards=rewards, values=values[:-1].detach(),
        bootstrap_value=values[-1].detach(), discounts=discounts, rho_bar=hp.rho_bar, c_bar=hp.c_bar,
    )
    if on_targets is not None:
        on_targets(targets.vs.detach(), mask)
    weights = Weights.of(mask, logp)  # read once for every masked term below
    advantages = targets.pg_advantages
    if hp.normalize_advantages:
        advantages = normalize_advantages(advantages, weights, std_floor=hp.adv_std_floor)
    anchor = behaviour_logp if anchor_logp is None else anchor_logp
    policy = clipped_surrogate_loss(logp, anchor, advantages, hp.clip_ratio, weights)
    offset = None
    if value_offset is not None:  # the bias in closed form: the head's values fitted to the targets' mean
        offset = masked_mean(targets.vs - (values[:-1] - value_offset), weights)
    value = value_transform.loss(head[:-1], targets.vs if offset is None else targets.vs - offset, weights)
    ent = entropy_bonus(entropy, weights)
    loss = policy + hp.value_coeff * value - hp.entropy_coeff * ent
    with torch.no_grad():
        stats = {
            "policy_loss": policy.detach(),
            "value_loss": value.detach(),
            "entropy": ent.detach(),
            "kl": approx_kl(logp.detach(), anchor, weights),
            "clip_fraction": clip_fraction(logp.detach(), anchor, hp.clip_ratio, weights),
            "value_target_mean": targets.vs.mean(),
            "importance_ratio_mean": targets.rhos.mean(),
        }
        if offset is not None:
            stats["value_offset"] = offset
    return loss, stats
