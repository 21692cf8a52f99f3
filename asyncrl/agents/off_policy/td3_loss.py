"""TD3: target policy smoothing, the clipped double-Q target, delayed actor (and target) updates.

Reference: Fujimoto, van Hoof & Meger 2018, "Addressing Function Approximation Error in Actor-Critic
Methods" (ICML): section 4.2 eq. 10 (clipped double Q), section 5.2 (delayed policy updates, d = 2),
section 5.3 eq. 14-15 (target policy smoothing: sigma = 0.2, clip c = 0.5), algorithm 1.

As in SAC (`sac_loss.py`), only terminated transitions stop the bootstrap; truncated ones bootstrap.
The critic loss is `asyncrl.agents.off_policy.sac_loss.critic_loss` (MSE per critic, summed).
"""

from __future__ import annotations

import torch


def smoothed_target_action(target_action: torch.Tensor, low: torch.Tensor | float, high: torch.Tensor | float,
                           noise_std: float = 0.2, noise_clip: float = 0.5, noise: torch.Tensor | None = None,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """`clip(mu'(s') + clip(eps, -c, c), low, high)`, eps ~ N(0, sigma^2) (eq. 14); pass `noise` to fix eps."""
    if noise is None:
        noise = torch.randn(target_action.shape, generator=generator, device=target_action.device) * noise_std
    smoothed = target_action + noise.clamp(-noise_clip, noise_clip)
    low_t = torch.as_tensor(low, dtype=smoothed.dtype, device=smoothed.device)
    high_t = torch.as_tensor(high, dtype=smoothed.dtype, device=smoothed.device)
    return torch.maximum(torch.minimum(smoothed, high_t), low_t)


def clipped_double_q_target(rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor,
                            gamma: float) -> torch.Tensor:
    """`y = r + gamma (1 - terminated) min(Q'_1, Q'_2)(s', a~')` (eq. 10 / 15); next_q `[2, B]`; detached."""
    with torch.no_grad():
        return rewards + gamma * (1.0 - terminated.float()) * next_q.min(dim=0).values


def actor_loss(q1_pi: torch.Tensor) -> torch.Tensor:
    """Deterministic policy gradient through the first critic: `-mean(Q_1(s, mu(s)))`."""
    return -q1_pi.mean()


def actor_update_due(critic_updates: int, policy_delay: int = 2) -> bool:
    """True after every `policy_delay`-th critic update (counted from 1): update the actor and the targets."""
    return critic_updates > 0 and critic_updates % policy_delay == 0
