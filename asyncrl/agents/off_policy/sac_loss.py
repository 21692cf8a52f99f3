"""Soft Actor-Critic: the soft Bellman target, critic / actor / temperature losses (the tanh-Gaussian log-prob the
actor samples with is `asyncrl.algo.squashed_gaussian`).

Reference: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905):
eq. 3 and 5 (soft Q target and critic loss), eq. 7 and 11 (policy loss), eq. 18 (automatic temperature with
target entropy -|A|), appendix C eq. 21 (tanh squashing correction); the minimum over two target critics
is TD3's clipped double Q (Fujimoto et al. 2018).

Pure tensor maths on a batch of transitions; ensembles are `[K, B]` (K critics, B transitions). Only a
*terminated* transition stops the bootstrap: a truncated one (time limit) still bootstraps from its true
final observation, so no function here takes a truncation flag.
"""

from __future__ import annotations

import torch


def soft_q_target(rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, next_logp: torch.Tensor,
                  alpha: float | torch.Tensor, gamma: float) -> torch.Tensor:
    """`y = r + gamma (1 - terminated) (min_k Q'_k(s', a') - alpha log pi(a'|s'))`, a' ~ pi(.|s'); detached.

    next_q: `[K, B]` target-critic values at (s', a') (min over K), or `[B]`.
    """
    with torch.no_grad():
        soft_value = (next_q.min(dim=0).values if next_q.dim() == 2 else next_q) - alpha * next_logp
        return rewards + gamma * (1.0 - terminated.float()) * soft_value


def critic_loss(q: torch.Tensor, target: torch.Tensor,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over the K critics of `0.5 * mean(w (Q_k(s, a) - y)^2)`; also |TD error| averaged over critics.

    q: `[K, B]`; target: `[B]`; weights: importance weights `[B]` (prioritized replay) or None.
    Returns (loss, td_abs `[B]`, detached: new priorities for prioritized replay).
    """
    err = q - target.detach()
    w = torch.ones_like(target) if weights is None else weights
    loss = 0.5 * (w * err.square()).mean(dim=-1).sum()
    return loss, err.detach().abs().mean(dim=0)


def actor_loss(q_pi: torch.Tensor, logp: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """`mean(alpha log pi(a|s) - min_k Q_k(s, a))`, a ~ pi(.|s) reparameterised (eq. 7 / 11)."""
    q = q_pi.min(dim=0).values if q_pi.dim() == 2 else q_pi
    return (alpha * logp - q).mean()


def target_entropy(action_dim: int) -> float:
    """The heuristic entropy target -|A| (section 5)."""
    return -float(action_dim)


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, entropy_target: float) -> torch.Tensor:
    """`-mean(alpha (log pi(a|s) + H_target))` with alpha = exp(log_alpha) (eq. 18).

    Its gradient lowers alpha when the policy entropy (-E log pi) is above the target and raises it below.
    """
    return -(log_alpha.exp() * (logp.detach() + entropy_target)).mean()
