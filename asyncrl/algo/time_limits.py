"""V-trace inputs that tell a time limit from a terminal state.

Reference: Pardo et al. 2018, "Time Limits in Reinforcement Learning" (ICML), section 3 ("partial-episode
bootstrapping"): when an episode is cut by a time limit rather than ended by the environment, the state it
reached still has a value, so the target of the last step is ``r_t + gamma * V(x_final)``, not ``r_t``.

V-trace (IMPALA eq. 1) is left as it is; the episode ends are folded into its ``rewards`` and ``discounts``:

* every episode end, terminated or truncated, gets discount 0, so no trace or bootstrap crosses into the next
  episode (whose first observation is what follows in the trajectory);
* a termination keeps its reward: the target there is ``r_t``;
* a truncation with a final observation gets the reward ``r_t + gamma * V(x_final)``: with discount 0 this is
  exactly the bootstrapped one-step target, and the trace is cut there;
* a truncation without one (a second cut of the same env inside one trajectory) gets the reward ``V(x_t)``,
  making ``delta_t = 0``: its own target is ``V(x_t)`` and the steps before it bootstrap from ``V(x_t)``,
  an unbiased (if shorter) n-step target. The step itself should be masked out of the loss.
"""

from __future__ import annotations

import torch

__all__ = ["episode_end_inputs"]


def episode_end_inputs(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    has_final: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and discounts for :func:`asyncrl.algo.vtrace.vtrace`, all ``[T, B]``.

    Args:
        rewards: ``r_t``.
        values: ``V(x_t)`` (used only where a truncation has no final observation).
        terminated: the episode reached a terminal state after action ``t``.
        truncated: a time limit cut the episode after action ``t`` (never together with ``terminated``).
        final_values: ``V(x_final)`` of the observation the env reached at step ``t``; read only where
            ``has_final``.
        has_final: ``truncated`` steps whose final observation is known.
    """
    with torch.no_grad():
        f32 = torch.float32
        terminated, truncated, has_final = terminated.bool(), truncated.bool(), has_final.bool() & truncated.bool()
        rewards = rewards.detach().to(f32)
        bootstrapped = rewards + gamma * torch.where(has_final, final_values.detach().to(f32), 0.0)
        rewards = torch.where(has_final, bootstrapped, rewards)
        rewards = torch.where(truncated & ~has_final, values.detach().to(f32), rewards)
        discounts = gamma * (~(terminated | truncated)).to(f32)
    return rewards, discounts
