"""The APPO forward and loss as one pure tensor function, the shape torch.compile takes whole (`--compile learner`).

`forward_loss` is what `APPOLearner._step` computes up to `loss.backward()`, with nothing data-dependent in
Python: the recurrent core is unrolled step by step with its cell written out (`RecurrentCore.cell_step`, the
same numbers as torch's RNN op to float rounding) and resets applied as masks at every step, the reward scale
and the value offset arrive as tensors, and the V-trace targets a return normaliser needs are returned rather
than handed to a callback. With `--precision bf16-all` the model's forward runs under bf16 autocast and its
outputs are cast to fp32 before the log-probs, the entropy, V-trace and the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.agents.compiled import autocast
from asyncrl.algo.value_transform import ValueTransform
from asyncrl.models.actor_critic import ActorCritic, RecurrentActorCritic
from asyncrl.models.cores import State, reset_rows
from asyncrl.models.obs import Obs, map_obs


@dataclass(frozen=True)
class LossSettings:
    """What `forward_loss` reads besides tensors: fixed for a run (a compiled graph specialises on them)."""

    hp: APPOHyperparams
    value_transform: ValueTransform
    action_shape: tuple[int, ...]
    keep_targets: bool = False  # return the V-trace targets and the training mask (--normalize-returns)
    center_values: bool = False  # --center-values: `value_offset` is used
    autocast_dtype: torch.dtype | None = None  # --precision bf16-all


def static_unroll(model: RecurrentActorCritic, obs: Obs, first: torch.Tensor,
                  state: State) -> tuple[torch.Tensor, torch.Tensor]:
    """`model.unroll` without Python branching on data: obs [T, B, ...], first [T, B] -> (policy output [T, B, A],
    values [T, B]), one cell step per t, env b's state zeroed before every step where `first[t, b]`."""
    t_len, b = first.shape
    flat = model._normalized(map_obs(obs, lambda x: x.flatten(0, 1)))
    features = model._features(flat).reshape(t_len, b, -1)
    outs = []
    for t in range(t_len):
        state = reset_rows(state, first[t])
        out, state = model.core.cell_step(features[t], state)
        outs.append(out)
    core_out = torch.stack(outs)
    policy = model._policy(core_out.flatten(0, 1), flat).reshape(t_len, b, -1)
    return policy, model.value_head(core_out).squeeze(-1)


def forward_loss(model: ActorCritic, settings: LossSettings, obs: Obs, actions: torch.Tensor,
                 behaviour_logp: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor, mask: torch.Tensor,
                 truncated: torch.Tensor, final_values: torch.Tensor, has_final: torch.Tensor,
                 value_offset: torch.Tensor, first: torch.Tensor, initial_state: State,
                 anchor_logp: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
    """(loss, stats, V-trace targets or None, training mask or None) of one time-major minibatch.

    `rewards` are already divided by the reward scale; `final_values` is V(final obs) where `has_final` (0
    elsewhere), computed outside; `value_offset` a 0-dim tensor, read with `settings.center_values` only;
    `anchor_logp` as in `appo_loss` (None: the ratio is taken against `behaviour_logp`)."""
    t, b = rewards.shape
    with autocast(settings.autocast_dtype, rewards.device):
        if isinstance(model, RecurrentActorCritic):
            policy_out, values = static_unroll(model, obs, first, initial_state)
            policy_out = policy_out.flatten(0, 1)
        else:
            policy_out, values = model(map_obs(obs, lambda x: x.flatten(0, 1)))
            values = values.reshape(t + 1, b)
    policy_out, values = policy_out.float(), values.float()
    dist = model.distribution(policy_out[: t * b])
    logp = dist.log_prob(actions.reshape(-1, *settings.action_shape)).reshape(t, b)
    entropy = dist.entropy().reshape(t, b)
    kept: dict[str, torch.Tensor] = {}

    def keep(vs: torch.Tensor, kept_mask: torch.Tensor) -> None:
        kept["vs"], kept["mask"] = vs, kept_mask

    loss, stats = appo_loss(logp, entropy, values, behaviour_logp, rewards, terminated, mask, settings.hp,
                            truncated=truncated, final_values=final_values, has_final=has_final,
                            value_transform=settings.value_transform,
                            value_offset=value_offset if settings.center_values else None,
                            on_targets=keep if settings.keep_targets else None, anchor_logp=anchor_logp)
    return loss, stats, kept.get("vs"), kept.get("mask")
