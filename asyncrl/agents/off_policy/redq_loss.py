"""REDQ: an ensemble of N critics whose target takes the minimum over a random subset of M of them.

Reference: Chen, Wang, Zhou & Ross 2021, "Randomized Ensembled Double Q-Learning: Learning Fast Without a
Model" (ICLR), algorithm 1: N = 10 critics, in-target minimisation over M = 2 drawn afresh for every update,
a high update-to-data ratio G = 20 (--utd's default for redq), SAC's entropy term, and an actor
trained on the mean of all N critics. Only terminated transitions stop the bootstrap.
"""

from __future__ import annotations

import torch


def sample_subset(num_critics: int = 10, subset_size: int = 2,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """M distinct critic indices out of N, uniformly; one subset per update (shared by the whole batch)."""
    if not 1 <= subset_size <= num_critics:
        raise ValueError(f"subset size {subset_size} must be in [1, {num_critics}]")
    return torch.randperm(num_critics, generator=generator)[:subset_size]


def redq_target(rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, next_logp: torch.Tensor,
                alpha: float | torch.Tensor, gamma: float, subset: torch.Tensor) -> torch.Tensor:
    """`y = r + gamma (1 - terminated) (min_{i in subset} Q'_i(s', a') - alpha log pi(a'|s'))`; next_q `[N, B]`."""
    with torch.no_grad():
        soft_value = next_q.index_select(0, subset.to(next_q.device)).min(dim=0).values - alpha * next_logp
        return rewards + gamma * (1.0 - terminated.float()) * soft_value


def actor_loss(q_pi: torch.Tensor, logp: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """`mean(alpha log pi(a|s) - mean_i Q_i(s, a))` over all N critics."""
    return (alpha * logp - q_pi.mean(dim=0)).mean()
