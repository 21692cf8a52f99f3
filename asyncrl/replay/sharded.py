"""S replay buffers used as one: chunks go to the shards round-robin, samples come from them in proportion to
their sizes, so every held transition is equally likely, as in one buffer of the combined capacity.

Shards let inserts and samples proceed in parallel (e.g. one shard per inserting process, each the single
writer of its own shard) and keep each buffer's arrays smaller. Sampled indices are global:
`shard * shard_capacity + local index`. Each shard counts its own inserts, so `insert_index` (and the age
derived from it) is per shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from asyncrl.replay.buffer import InsertResult, ReplayBatch, ReplayBuffer


class ShardedReplay:
    def __init__(self, shards: Sequence[ReplayBuffer]):
        if not shards:
            raise ValueError("need at least one shard")
        capacities = {s.capacity for s in shards}
        if len(capacities) != 1:
            raise ValueError(f"shards must have equal capacities, got {sorted(capacities)}")
        self.shards = list(shards)
        self.shard_capacity = capacities.pop()
        self._next = 0

    @property
    def size(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def capacity(self) -> int:
        return self.shard_capacity * len(self.shards)

    def insert(self, *args: Any, **kwargs: Any) -> InsertResult:
        """Insert a chunk into the next shard in turn; indices come back global."""
        shard = self._next
        self._next = (self._next + 1) % len(self.shards)
        result = self.shards[shard].insert(*args, **kwargs)
        base = shard * self.shard_capacity
        return InsertResult(indices=result.indices + base, evicted=result.evicted + base)

    def sample(self, n: int, rng: np.random.Generator) -> ReplayBatch:
        sizes = np.array([s.size for s in self.shards], np.float64)
        if sizes.sum() == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        counts = rng.multinomial(n, sizes / sizes.sum())
        parts = [(k, self.shards[k].sample(int(c), rng)) for k, c in enumerate(counts) if c]
        for k, batch in parts:
            batch.indices = batch.indices + k * self.shard_capacity
        fields = [f for f in ReplayBatch.__dataclass_fields__ if f != "weights"]
        return ReplayBatch(**{f: np.concatenate([getattr(b, f) for _, b in parts]) for f in fields})

    def gather(self, indices: np.ndarray) -> ReplayBatch:
        """Transitions at global indices, in the given order."""
        shard, local = np.divmod(np.asarray(indices), self.shard_capacity)
        order = np.argsort(shard, kind="stable")
        parts = [self.shards[k].gather(local[order][shard[order] == k]) for k in np.unique(shard)]
        fields = [f for f in ReplayBatch.__dataclass_fields__ if f != "weights"]
        merged = {f: np.concatenate([getattr(b, f) for b in parts]) for f in fields}
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        out = {f: v[inverse] for f, v in merged.items()}
        out["indices"] = np.asarray(indices)
        return ReplayBatch(**out)
