"""One run's wiring: the shared buffers, the channels and which processes to start with which arguments.

Built once per rank by `build_wiring`, before any process is forked; the runner starts `processes` in order and
restarts any of them with the same arguments. Torch-free (the runner imports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.models.registry import state_layout
from asyncrl.runtime.distributed.rank import DataParallel
from asyncrl.runtime.plumbing.channels import Channels
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, local_slots, num_slots, remote_slots
from asyncrl.shm import SharedArrays, SharedWeights


@dataclass(frozen=True)
class ProcessSpec:
    """A child process: its name, and the `module:function(*args)` it runs after the fork."""

    name: str
    module: str
    function: str
    args: tuple


@dataclass
class RunWiring:
    traj: SharedArrays  # the trajectory slots
    weights: list[SharedWeights]  # the published policies, one per --num-policies
    channels: Channels
    processes: list[ProcessSpec]  # in start order: the learner first

    def close(self) -> None:
        """Drop this process's handles on the weights buffers (the children's copies go with them)."""
        for weights in self.weights:
            os.close(weights.fd)


def build_wiring(cfg: Config, spec: EnvSpec, ranks: DataParallel | None = None) -> RunWiring:
    """Allocate the shared memory and queues, hand the rollout workers their free slots and list the processes.
    `ranks` (under torchrun) goes to the learner, which joins the process group with it.

    ConfigError (one line) if memory or /dev/shm runs out."""
    try:
        traj = allocate_trajectories(cfg, spec, state_layout(cfg))  # the model's per-env state columns (--rnn)
        weights = [SharedWeights() for _ in range(cfg.acting_policies)]
        local = local_slots(cfg)
        channels = Channels.create(cfg.workers, num_slots(cfg), cfg.policy_workers,
                                   (local, local + remote_slots(cfg)))
    except (OSError, MemoryError) as exc:  # RAM, /dev/shm (the queues) or a file-size limit ran out
        raise ConfigError(f"cannot allocate the shared buffers ({getattr(exc, 'strerror', None) or exc}); "
                          f"lower --workers, --envs-per-worker, --rollout or --batch-size, or free memory"
                          ) from None
    # Lockstep (--deterministic): one batch of slots, so the worker waits for each update before collecting on.
    free = cfg.trajectories_per_batch if cfg.deterministic else local_slots(cfg)
    if free:
        channels.free.put_many(list(range(free)))
    if remote_slots(cfg):  # the remote groups' own, handed back to them by the learner (`Channels.give_back`)
        channels.free_remote.put_many(list(range(*channels.remote_ids)))
    processes = [ProcessSpec("learner", "asyncrl.runtime.roles.learner", "run_learner",
                             (cfg, spec, traj, weights, channels, ranks))]
    processes += [ProcessSpec(f"policy-{i}", "asyncrl.runtime.roles.policy_worker", "run_policy_worker",
                              (i, cfg, spec, traj, weights, channels))
                  for i in range(cfg.policy_workers if cfg.workers else 0)]  # remote groups act on their own
    processes += [ProcessSpec(f"rollout-{i}", "asyncrl.runtime.roles.rollout_worker", "run_rollout_worker",
                              (i, cfg, traj, channels)) for i in range(cfg.workers)]
    if cfg.remote_workers:  # the Ray transport's client: remote actor groups' slots into these buffers
        processes.append(ProcessSpec("remote-0", "asyncrl.runtime.roles.remote_bridge", "run_bridge",
                                     (cfg, spec, traj, weights, channels)))
    return RunWiring(traj, weights, channels, processes)
