"""Which policy acts for each env column (`--num-policies`, `--policy-mapping`): a rollout worker's side.

Columns are numbered across the run, worker by worker and split by split (`envs_per_split` each; a multi-agent
env's agents are consecutive columns). `fixed`: column g is policy g mod N, so agent k of a multi-agent env is
policy k when N divides the agents, and a single-agent env's columns take turns. `random`: each column draws a
policy at each of its episode starts (for an agent of a multi-agent env: when the env's episode starts again).
The worker writes the map into the slot's `policy` row before asking for each step's actions.
"""

from __future__ import annotations

import numpy as np

from asyncrl.config import Config


class PolicyMap:
    """The current policy of each env column of one rollout worker's splits."""

    def __init__(self, cfg: Config, worker: int) -> None:
        self.num_policies, self.random = cfg.num_policies, cfg.policy_mapping == "random"
        e = cfg.envs_per_split
        self.current = [((((worker * cfg.worker_splits) + split) * e + np.arange(e)) % cfg.num_policies)
                        .astype(np.int8) for split in range(cfg.worker_splits)]
        self.rng = np.random.default_rng((cfg.seed, worker))
        if self.random:
            for row in self.current:
                row[:] = self.rng.integers(0, self.num_policies, len(row))

    def write(self, split: int, policy_row: np.ndarray, first_row: np.ndarray) -> None:
        """Write the split's map into a step's `policy` row; `random` draws anew where an episode starts."""
        current = self.current[split]
        if self.random and first_row.any():
            starts = np.flatnonzero(first_row)
            current[starts] = self.rng.integers(0, self.num_policies, len(starts))
        policy_row[:] = current

    def of(self, split: int, env: int) -> int:
        """The policy acting for column `env` of the split (who played an episode that just ended there)."""
        return int(self.current[split][env]) if env >= 0 else -1
