"""A sum-tree over n non-negative priorities with vectorised O(log n) batch sampling and updates.

Reference: Schaul et al. 2016, "Prioritized Experience Replay", appendix B.2.1 (the sum-tree).

The tree is one float64 array of `2 P` nodes, `P` = n rounded up to a power of two: node 1 is the root, node
`i` has children `2 i` and `2 i + 1`, and leaf `j` is node `P + j`. A batch of prefix-sum queries descends
all together, one numpy step per level (`log2 P` steps, no Python loop per query), and a batch of leaf
updates recomputes only the touched parents, level by level, from their children (so no drift accumulates).
"""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self.tree[self.leaves + np.asarray(indices)]

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaf priorities; with duplicate indices the last occurrence wins."""
        indices = np.asarray(indices, np.int64).ravel()
        priorities = np.broadcast_to(np.asarray(priorities, np.float64), indices.shape)
        if indices.size == 0:
            return
        if (indices < 0).any() or (indices >= self.capacity).any():
            raise IndexError(f"sum-tree index out of range [0, {self.capacity})")
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            raise ValueError("priorities must be finite and >= 0")
        # keep the last occurrence of each index: unique on the reversed array returns first hits
        uniq, first_in_reversed = np.unique(indices[::-1], return_index=True)
        nodes = uniq + self.leaves
        self.tree[nodes] = priorities[::-1][first_in_reversed]
        for _ in range(self.depth):  # repeated parents just write the same sum twice
            nodes = nodes >> 1
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Leaf index j for each query q in [0, total): the first j whose cumulative priority exceeds q.

        Never returns a zero-priority leaf (rounding cannot push a query into an empty subtree).
        """
        q = np.asarray(prefix_sums, np.float64).copy()
        node = np.ones(q.shape, np.int64)
        tree = self.tree
        for _ in range(self.depth):
            left = 2 * node
            left_sum = tree[left]
            go_right = (q >= left_sum) & (tree[left + 1] > 0)
            q -= np.where(go_right, left_sum, 0.0)
            node = left + go_right
        return node - self.leaves

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n leaves drawn with probability proportional to priority, stratified over n equal ranges."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample: every priority is 0")
        q = (np.arange(n) + rng.random(n)) * (total / n)
        return self.find(np.minimum(q, np.nextafter(total, 0)))
