"""REDQ learner: SAC with N = 10 critics, the target's min over a random subset of M = 2 (drawn per update), the
actor on the mean of all N, and 20 updates per env step by default (Chen et al. 2021; `asyncrl.algo.redq`)."""

from __future__ import annotations

import torch

from asyncrl.algo import redq
from asyncrl.learners.sac import SACLearner

SUBSET_SIZE = 2


class REDQLearner(SACLearner):
    num_critics = 10
    target_subset = SUBSET_SIZE

    def _target(self, rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, next_logp: torch.Tensor,
                alpha: torch.Tensor) -> torch.Tensor:
        subset = redq.sample_subset(self.num_critics, SUBSET_SIZE)
        return redq.redq_target(rewards, terminated, next_q, next_logp, alpha, self.cfg.gamma, subset)

    def _actor_loss(self, q_pi: torch.Tensor, logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return redq.actor_loss(q_pi, logp, alpha)
