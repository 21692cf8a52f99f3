"""REDQ learner: SAC with N = 10 critics, the target's min over a random subset of M = 2 (drawn per update), the
actor on the mean of all N, and 20 updates per env step by default (Chen et al. 2021; the losses in
`redq_loss.py`).

As in the paper's algorithm 1 (and its reference code's `policy_update_delay`), the actor and the temperature
are updated once per G = `--utd` critic updates, i.e. once per env step. Only the M target critics of the drawn
subset are evaluated: the target is the same as `redq.redq_target` over all N (tests/test_offpolicy_maths.py).
"""

from __future__ import annotations

import torch

from asyncrl.agents.off_policy import redq_loss as redq
from asyncrl.agents.off_policy.sac import SACLearner

SUBSET_SIZE = 2


class REDQLearner(SACLearner):
    num_critics = 10
    target_subset = SUBSET_SIZE

    @property
    def actor_delay(self) -> int:
        return max(1, round(self.utd))

    def _next_q(self, next_obs: torch.Tensor, next_action: torch.Tensor) -> torch.Tensor:
        """Q'(s', a') of a fresh random subset of M target critics only: [M, B]."""
        return self.critic_target(next_obs, next_action, members=redq.sample_subset(self.num_critics, SUBSET_SIZE))

    def _actor_loss(self, q_pi: torch.Tensor, logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return redq.actor_loss(q_pi, logp, alpha)
