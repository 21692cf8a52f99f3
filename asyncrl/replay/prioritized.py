"""Prioritized experience replay (proportional variant) over a `ReplayBuffer`.

Reference: Schaul et al. 2016, "Prioritized Experience Replay", section 3.3 and algorithm 1.

Transition i is drawn with probability `P(i) = p_i^alpha / sum_k p_k^alpha`, where `p_i = |TD error| + eps`;
new transitions get the largest priority seen so far, so each is replayed at least about once. The bias is
corrected by importance weights `w_i = (N P(i))^-beta / max_batch w`, with beta annealed linearly from
`beta_start` to 1 over `beta_updates` updates. Transitions the buffer made unsampleable get priority 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncrl.replay.buffer import InsertResult, ReplayBatch, ReplayBuffer
from asyncrl.replay.sum_tree import SumTree


class PrioritizedReplay:
    def __init__(self, buffer: ReplayBuffer, alpha: float = 0.6, beta_start: float = 0.4,
                 beta_updates: int = 100_000, eps: float = 1e-6):
        self.buffer = buffer
        self.alpha, self.beta_start, self.beta_updates, self.eps = alpha, beta_start, beta_updates, eps
        self.tree = SumTree(buffer.capacity)
        self.max_priority = 1.0
        self.updates = 0  # priority updates so far: drives the beta schedule

    @property
    def size(self) -> int:
        return self.buffer.size

    @property
    def beta(self) -> float:
        frac = min(1.0, self.updates / max(self.beta_updates, 1))
        return self.beta_start + (1.0 - self.beta_start) * frac

    def insert(self, *args: Any, **kwargs: Any) -> InsertResult:
        """`ReplayBuffer.insert`; the new transitions get the current maximum priority."""
        result = self.buffer.insert(*args, **kwargs)
        self.tree.update(result.indices, self.max_priority ** self.alpha)
        self.tree.update(result.evicted, 0.0)
        return result

    def sample(self, n: int, rng: np.random.Generator) -> ReplayBatch:
        indices = self.tree.sample(n, rng)
        probs = self.tree.get(indices) / self.tree.total
        weights = (self.buffer.size * probs) ** -self.beta
        batch = self.buffer.gather(indices)
        batch.weights = (weights / weights.max()).astype(np.float32)
        return batch

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set `p_i = |td_i| + eps` for the sampled `indices` (duplicates: the last one wins)."""
        priorities = np.abs(np.asarray(td_errors, np.float64)) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max(initial=0.0)))
        indices = np.asarray(indices)
        keep = self.buffer.sampleable.flat[indices]  # evicted since it was sampled: stays at 0
        self.tree.update(indices, np.where(keep, priorities ** self.alpha, 0.0))
        self.updates += 1
