"""SAC's update as two pure tensor functions, the shape torch.compile takes whole (`--compile learner|all`).

`critic_loss_fn` is the soft Bellman target (no gradient) and the twin critics' loss; `actor_loss_fn` the
reparameterised actor loss. Each is compiled whole-graph with its backward; the optimizer steps (torch's fused
Adam) and the temperature's one-line loss stay outside. The same arithmetic as `SACLearner._update`'s eager path.
"""

from __future__ import annotations

import torch
from torch import nn

from asyncrl.agents.off_policy import sac_loss as sac


def critic_loss_fn(actor: nn.Module, critic: nn.Module, critic_target: nn.Module, gamma: float, obs: torch.Tensor,
                   actions: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor, next_obs: torch.Tensor,
                   weights: torch.Tensor | None, alpha: torch.Tensor,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(critic loss, |TD error| [B], mean Q) on a sampled batch; `actor` is the tanh-Gaussian net."""
    with torch.no_grad():
        next_action, next_logp = actor(next_obs)
        target = sac.soft_q_target(rewards, terminated, critic_target(next_obs, next_action), next_logp, alpha, gamma)
    q = critic(obs, actions)
    q_loss, td_abs = sac.critic_loss(q, target, weights)
    return q_loss, td_abs, q.detach().mean()


def actor_loss_fn(actor: nn.Module, critic: nn.Module, obs: torch.Tensor,
                  alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(actor loss, log pi of the sampled actions, detached) on a sampled batch."""
    action, logp = actor(obs)
    return sac.actor_loss(critic(obs, action), logp, alpha), logp.detach()
