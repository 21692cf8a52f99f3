"""The lock-free queues between processes and the shared control block. Messages are small tuples of ints.

Data path (see docs/architecture.md):
    rollout worker --requests (worker, split, slot, t)--> policy worker
    policy worker  --actions_ready[worker] (split)-----> rollout worker
    rollout worker --full (slot)-----------------------> learner
    learner        --free (slot)-----------------------> rollout workers
    learner        --free_remote (slot)----------------> the Ray bridge (remote actor groups' slots)
    every process  --reports (kind, id, payload)-------> runner
    runner         --learner_cmds (command, ...)-------> learner
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from faster_fifo import Queue

from asyncrl.runtime.plumbing.liveness import allocate_liveness
from asyncrl.shm import SharedArrays

Empty = queue.Empty
Full = queue.Full

# Control block fields.
STOP = 0  # set to 1 by the runner: every process leaves its loop


@dataclass
class Channels:
    requests: Queue
    actions_ready: list[Queue]
    full: Queue
    free: Queue
    reports: Queue
    learner_cmds: Queue
    control: SharedArrays
    live: SharedArrays  # heartbeats, slot owners, action handshake (asyncrl.runtime.plumbing.liveness)
    free_remote: Queue  # the remote actor groups' slots (ids in `remote_ids`), freed apart from the local ones
    remote_ids: tuple[int, int] = (0, 0)  # [first, end) of the remote groups' slot ids

    @classmethod
    def create(cls, workers: int, slots: int, policy_workers: int = 1,
               remote_ids: tuple[int, int] = (0, 0)) -> Channels:
        return cls(
            requests=Queue(max_size_bytes=4_000_000),
            actions_ready=[Queue(max_size_bytes=64_000) for _ in range(workers)],
            full=Queue(max_size_bytes=max(64_000, 64 * slots)),
            free=Queue(max_size_bytes=max(64_000, 64 * slots)),
            reports=Queue(max_size_bytes=16_000_000),
            learner_cmds=Queue(max_size_bytes=64_000),
            control=SharedArrays({"flags": ((4,), np.dtype(np.int64))}),
            live=allocate_liveness(workers, policy_workers, slots),
            free_remote=Queue(max_size_bytes=max(64_000, 64 * slots)),
            remote_ids=remote_ids,
        )

    @property
    def stopping(self) -> bool:
        return bool(self.control["flags"][STOP])

    def request_stop(self) -> None:
        self.control["flags"][STOP] = 1

    def give_back(self, slots: list[int]) -> None:
        """Free trained (or recovered) slots: a remote group's to `free_remote`, the rest to `free`."""
        first, end = self.remote_ids
        remote = [s for s in slots if first <= s < end]
        local = [s for s in slots if not first <= s < end] if remote else slots
        if local:
            self.free.put_many(local)
        if remote:
            self.free_remote.put_many(remote)

    def all_queues(self) -> list[Queue]:
        return [self.requests, *self.actions_ready, self.full, self.free, self.reports, self.learner_cmds,
                self.free_remote]

    def named_queues(self) -> list[tuple[str, Queue]]:
        names = ["requests", *(f"actions_ready[{i}]" for i in range(len(self.actions_ready))), "full", "free",
                 "reports", "learner_cmds", "free_remote"]
        return list(zip(names, self.all_queues()))


def get_or_stop(q: Queue, channels: Channels, timeout: float = 0.1, idle: Callable[[], None] | None = None):
    """Block on q until a message arrives; None once the run is stopping. `idle` runs after each timeout."""
    while not channels.stopping:
        try:
            return q.get(timeout=timeout)
        except Empty:
            if idle is not None:
                idle()
    return None


def drain(q: Queue) -> int:
    """Discard whatever is queued; return how many messages were dropped."""
    n = 0
    while True:
        try:
            n += len(q.get_many(block=False))
        except Empty:
            return n


def report(channels: Channels, kind: str, ident: int, payload: dict) -> None:
    """Best effort: statistics are never worth blocking the data path for."""
    try:
        channels.reports.put((kind, ident, time.time(), payload), block=False)
    except Full:
        pass
