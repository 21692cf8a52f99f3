"""Which policy acts for each env column (`--num-policies`, `--policy-mapping`, `--self-play`): a rollout
worker's side.

Columns are numbered across the run, worker by worker and split by split (`envs_per_split` each; a multi-agent
env's agents are consecutive columns). `fixed`: column g is policy g mod N, so agent k of a multi-agent env is
policy k when N divides the agents, and a single-agent env's columns take turns. `random`: each column draws a
policy at each of its episode starts (for an agent of a multi-agent env: when the env's episode starts again).

With `--self-play` every episode of a multi-agent env seats one learning policy (instance g's is g mod N, or a
random one) at a random seat, and a random snapshot of the pool (ids N .. N + pool - 1) at every other seat; the
seats are drawn again when the whole instance starts a new episode.

The worker writes the map into the slot's `policy` row before asking for each step's actions.
"""

from __future__ import annotations

import numpy as np

from asyncrl.config import Config


class PolicyMap:
    """The current policy of each env column of one rollout worker's splits."""

    def __init__(self, cfg: Config, worker: int, agents: int = 1) -> None:
        self.num_policies, self.random = cfg.num_policies, cfg.policy_mapping == "random"
        self.pool = cfg.self_play_pool if cfg.self_play else 0
        self.agents = agents
        e = cfg.envs_per_split
        self.start = [((worker * cfg.worker_splits) + split) * e for split in range(cfg.worker_splits)]
        self.current = [((start + np.arange(e)) % cfg.num_policies).astype(np.int8) for start in self.start]
        self.rng = np.random.default_rng((cfg.seed, worker))
        for split, row in enumerate(self.current):
            if self.pool:
                self._seat(split, np.arange(e // agents))
            elif self.random:
                row[:] = self.rng.integers(0, self.num_policies, len(row))

    def write(self, split: int, policy_row: np.ndarray, first_row: np.ndarray) -> None:
        """Write the split's map into a step's `policy` row, drawing anew where episodes start."""
        current = self.current[split]
        if self.pool and first_row.any():
            starting = first_row.reshape(-1, self.agents).all(axis=1)  # the whole instance starts over
            if starting.any():
                self._seat(split, np.flatnonzero(starting))
        elif self.random and first_row.any():
            starts = np.flatnonzero(first_row)
            current[starts] = self.rng.integers(0, self.num_policies, len(starts))
        policy_row[:] = current

    def _seat(self, split: int, instances: np.ndarray) -> None:
        """Self-play: a learning policy at one random seat of each instance, pool snapshots at the others."""
        current, a = self.current[split], self.agents
        for i in instances.tolist():
            seats = current[i * a:(i + 1) * a]
            seats[:] = self.num_policies + self.rng.integers(0, self.pool, a)
            learner = (self.rng.integers(0, self.num_policies) if self.random
                       else (self.start[split] // a + i) % self.num_policies)
            seats[self.rng.integers(0, a)] = learner

    def of(self, split: int, env: int) -> int:
        """The policy acting for column `env` of the split (who played an episode that just ended there)."""
        return int(self.current[split][env]) if env >= 0 else -1

    def learning(self, policy: int) -> bool:
        """A learning policy, not a self-play snapshot."""
        return 0 <= policy < self.num_policies
