"""The Ray transport: remote actor groups (`group.py`) on a Ray cluster feed this machine's learner.

One forked process of the run (`remote-0`, beside the rollout workers) is the Ray client. It starts
`--remote-workers` actor groups where Ray's resources place them, sends each the learner's published weights
(through Ray's object store: `ray.put` once per new version, its ref posted on a `WeightsBoard` actor that each
group asks between steps, so a group acts on weights as fresh as a local policy worker's, give or take 50 ms),
asks each group for its next slots only once free slots of the shared trajectory buffer are reserved for them (a
second call queued behind the first while slots are to spare, so a group steps on while its last slots travel),
writes each shipped slot into its reserved slot and queues it for the learner: from there on the learner cannot
tell it from a local one (its `versions` column holds the version that acted, so the lag cap and V-trace apply).
Reserving is the back-pressure a local worker gets from the free queue: a learner that falls behind slows the
groups down rather than letting stale trajectories pile up in Ray's object store.

A group that dies (its process, or its node leaving the cluster) is restarted with one warning line, or dropped
after `MAX_RESTARTS`; nothing the learner holds is lost. Reports go to the runner as `remote` (env steps, episodes,
bytes, slots, arrival lag, per group), and the bridge beats `beat_remote` like any worker.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.plumbing.channels import Channels, Empty, report
from asyncrl.runtime.plumbing.interval_stats import IntervalStats
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING
from asyncrl.runtime.plumbing.trajectories import REMOTE_IN_FLIGHT
from asyncrl.runtime.roles.process import init_child
from asyncrl.shm import SharedArrays, SharedWeights

MAX_RESTARTS = 3  # restarts of one group before it is dropped


@dataclass
class GroupState:
    """The bridge's view of one actor group."""

    index: int
    handle: Any = None
    generation: int = 0
    restarts: int = 0
    node: str = "?"
    dropped: bool = False
    # the interval's counts
    env_steps: int = 0
    slots: int = 0
    bytes: int = 0
    lags: list[int] = field(default_factory=list)


class Bridge:
    def __init__(self, cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: list[SharedWeights],
                 channels: Channels):
        import ray

        self.ray, self.cfg, self.spec, self.traj, self.channels = ray, cfg, spec, traj, channels
        self.weights = weights
        self.live = channels.live
        self.me = cfg.workers  # the bridge's row in the liveness arrays (slot owner, transit, steps)
        self.owner, self.transit = self.live["slot_owner"], self.live["transit"]
        self.stepped, self.budget = self.live["stepped"], self.live["step_budget"]
        self.budget_told = False
        self.stats = IntervalStats(channels, "remote", 0, cfg.report_interval)
        for key in ("env_steps", "env_errors", "slots", "bytes", "t_wait_slot"):
            self.stats.add(key, 0)
        self.stats.extend("episodes", [])
        if cfg.acting_policies > 1:
            self.stats.extend("episode_policies", [])
        self.groups = [GroupState(i) for i in range(cfg.remote_workers)]
        self.pending: dict[Any, tuple[GroupState, list[int]]] = {}  # call -> its group and its reserved slots
        self.pool: list[int] = []  # free slots taken (recorded as the bridge's), not yet reserved for a call
        self.starved: list[GroupState] = []  # groups whose next call waits for free slots
        self.splits = cfg.remote_splits  # slots one call fills
        self.flat: list[np.ndarray] = []
        self.versions: list[int] = []
        self.ref: Any = None  # the current weights in the object store
        self.board: Any = None  # the WeightsBoard actor the groups read them from

    # ----- weights -----
    def _refresh_weights(self) -> bool:
        """Read newer published weights into the object store; True when there are some."""
        if self.versions and all(w.version == v for w, v in zip(self.weights, self.versions)):
            return False
        flat, versions = [], []
        for w in self.weights:
            view = w.attach()
            if view is None:
                return False
            out = np.empty_like(view)
            version = w.read_into(out)
            if version is None:  # torn read: the learner is publishing; next time
                return False
            flat.append(out)
            versions.append(version)
        self.flat, self.versions, self.ref = flat, versions, self.ray.put(flat)
        self.board.post.remote(versions, [self.ref])  # in a list: the groups get the ref, not the arrays
        return True

    # ----- groups -----
    def _start(self, group: GroupState) -> None:
        from asyncrl.runtime.remote.group import ActorGroup

        remote = self.ray.remote(ActorGroup).options(num_cpus=self.cfg.remote_cpus, max_restarts=0,
                                                     max_concurrency=1)
        group.handle = remote.remote(self.cfg, self.spec, group.index, group.generation, self.board)
        self._call(group)

    def _call(self, group: GroupState) -> None:
        """Ask the group for its next slots once free slots are reserved for them (otherwise it waits in
        `starved`): like a local worker, a group steps only into slots it holds, so a learner that falls behind
        slows the groups instead of letting stale trajectories pile up. A second call is queued behind the
        first while slots are to spare, so the group steps on while its last slots travel."""
        if not self._reserve(self.splits):
            self.starved.append(group)
            return
        slots, self.pool = self.pool[:self.splits], self.pool[self.splits:]
        self.pending[group.handle.collect.remote()] = (group, slots)
        if sum(g is group for g, _ in self.pending.values()) < REMOTE_IN_FLIGHT and self._reserve(self.splits,
                                                                                                  spare=True):
            slots, self.pool = self.pool[:self.splits], self.pool[self.splits:]
            self.pending[group.handle.collect.remote()] = (group, slots)

    def _reserve(self, n: int, spare: bool = False) -> bool:
        """Take free slots into the pool until it holds `n` (without waiting); `spare`: only slots nobody waits
        for (no group is starved). Whether it holds them."""
        if spare and self.starved:
            return False
        while len(self.pool) < n:
            self.transit[self.me] = TAKING
            try:
                taken = self.channels.free_remote.get_many(block=False, max_messages_to_get=n - len(self.pool))
            except Empty:
                taken = []
            self.owner[taken] = self.me
            self.pool += taken
            self.transit[self.me] = NO_TRANSIT
            if not taken:
                return False
        return True

    def _wait(self) -> list[Any]:
        """The calls that returned, after a short wait: on Ray while every group has a call out, else first on the
        free queue, blocking as a local worker does (so the groups get their turn at the slots the learner frees)."""
        pending = list(self.pending)
        if not self.starved:
            if not pending:  # every group dropped: nothing to wait for but the stop
                time.sleep(0.05)
                return []
            return self.ray.wait(pending, num_returns=1, timeout=0.05)[0]
        need = self.splits * len(self.starved) - len(self.pool)
        if need > 0:
            self.transit[self.me] = TAKING
            try:
                taken = self.channels.free_remote.get_many(timeout=0.02, max_messages_to_get=need)
            except Empty:
                taken = []
            self.owner[taken] = self.me
            self.pool += taken
            self.transit[self.me] = NO_TRANSIT
        return self.ray.wait(pending, num_returns=len(pending), timeout=0)[0] if pending else []

    def _feed_starved(self) -> None:
        """Calls for the groups that waited for free slots, in order, as slots come free."""
        waiting, self.starved = self.starved, []
        for group in waiting:
            if not group.dropped:
                self._call(group)

    def _failed(self, group: GroupState, exc: Exception) -> None:
        """A group's call raised: its actor or node is gone. Restart it elsewhere, or drop it."""
        for ref, (g, slots) in list(self.pending.items()):
            if g is group:
                del self.pending[ref]
                self.pool += slots  # reserved for a call that will not return: for the next one
        self.starved = [g for g in self.starved if g is not group]
        self.ray.kill(group.handle, no_restart=True) if group.handle is not None else None
        cause = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        group.restarts += 1
        if group.restarts > MAX_RESTARTS:
            group.dropped = True
            left = sum(not g.dropped for g in self.groups)
            self._say("warning", f"remote group {group.index} (node {group.node}) failed {group.restarts} times "
                                 f"(last: {type(exc).__name__}: {cause}); dropped it, {left} remote groups left")
            if left == 0 and self.cfg.workers == 0:
                self._fatal(f"every remote actor group failed (last: {type(exc).__name__}: {cause}) and no local "
                            f"rollout worker is left; check the Ray nodes (ray status) or add --workers")
            return
        self._say("warning", f"remote group {group.index} (node {group.node}) died ({type(exc).__name__}: {cause});"
                             f" restarted it on the cluster [{group.restarts} of {MAX_RESTARTS} restarts]")
        group.generation += 1
        group.node = "?"
        self._start(group)

    # ----- the loop -----
    def run(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from asyncrl.runtime.remote.group import WeightsBoard

        # On this machine's node (the head where the cluster is set up as docs/ray.md says): a board on a node
        # that leaves would take every group down with it.
        here = NodeAffinitySchedulingStrategy(self.ray.get_runtime_context().get_node_id(), soft=False)
        self.board = self.ray.remote(WeightsBoard).options(num_cpus=0, scheduling_strategy=here).remote()
        while not self._refresh_weights():  # the learner's first weights
            if self.channels.stopping:
                return
            self._beat()
            time.sleep(0.01)
        for group in self.groups:
            self._start(group)
        serving = False
        try:
            t0 = time.monotonic()
            while not self.channels.stopping:
                self._beat()
                now = time.monotonic()
                if self.starved:  # a group waited for free slots since the last turn: the learner is behind
                    self.stats.add("t_wait_slot", now - t0)
                t0 = now
                ready = self._wait()
                self._refresh_weights()
                for ref in ready:
                    if ref not in self.pending:  # a second call of a group that failed above: _failed let it go
                        continue
                    group, slots = self.pending.pop(ref)
                    try:
                        shipment = self.ray.get(ref)
                    except self.ray.exceptions.RayError as exc:
                        self._failed(group, exc)
                        continue
                    if not serving:  # until the first shipment, the wait is the groups' start-up
                        self.stats.restart()
                        serving = True
                    self._deliver(group, shipment, slots)
                    self._call(group)
                self._feed_starved()
                self._maybe_report()
        finally:
            self._maybe_report(force=True)
            for handle in [g.handle for g in self.groups] + [self.board]:
                if handle is not None:
                    self.ray.kill(handle, no_restart=True)

    def _deliver(self, group: GroupState, shipment: dict[str, Any], slots: list[int]) -> None:
        """Write the shipment into its reserved slots, queue them for the learner, count its steps."""
        if "fatal" in shipment:
            self._fatal(shipment["fatal"], shipment.get("exit_code", 1))
            self.pool += slots
            return
        if group.node == "?":
            group.node = shipment.get("node", "?")
        for note in shipment["errors"]:
            self.live["env_errors"][self.me] += note["count"]
            report(self.channels, "env_error", self.cfg.workers,
                   {**note, "worker": self.cfg.workers, "name": f"remote group {group.index} (node {group.node})"})
        current = self.versions[0] if self.versions else 0
        for slot, arrays in zip(slots, shipment["slots"]):  # a group fills its splits' slots together
            for name, a in arrays.items():
                self.traj[name][slot] = a
            self.transit[self.me] = slot  # handing over: ownership cleared, not yet queued
            self.owner[slot] = NO_OWNER
            self.channels.full.put(slot)
            self.transit[self.me] = NO_TRANSIT
            lag = current - int(arrays["versions"].min())
            group.lags.append(lag)
            group.slots += 1
            nbytes = sum(a.nbytes for a in arrays.values())
            group.bytes += nbytes
            self.stats.add("bytes", nbytes)
            self.stats.add("slots", 1)
        steps = shipment["env_steps"]
        group.env_steps += steps
        self.stats.add("env_steps", steps)
        self.stats.add("env_errors", shipment["env_errors"])
        self.stats.extend("episodes", shipment["episodes"])
        if "episode_policies" in shipment:
            self.stats.extend("episode_policies", shipment["episode_policies"])
        self.stepped[self.me] += steps
        self.pool += slots[len(shipment["slots"]):]
        if not self.budget_told and 0 < self.budget[0] <= self.stepped.sum():
            self._maybe_report(force=True)  # the runner stops on reported steps
            self.budget_told = True

    # ----- reports -----
    def _beat(self) -> None:
        self.live["beat_remote"][0] = time.monotonic()

    def _maybe_report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.stats.last < self.stats.every_s:
            return
        groups = {}
        for g in self.groups:
            groups[g.index] = {"node": g.node, "env_steps": g.env_steps, "slots": g.slots, "bytes": g.bytes,
                               "lag_sum": sum(g.lags), "lag_n": len(g.lags), "lag_max": max(g.lags, default=0),
                               "alive": not g.dropped, "restarts": g.restarts}
            g.env_steps = g.slots = g.bytes = 0
            g.lags = []
        self.stats.maybe_report(force=True, groups=groups)

    def _say(self, kind: str, message: str) -> None:
        report(self.channels, kind, 0, {"message": message})

    def _fatal(self, message: str, exit_code: int = 1) -> None:
        self.channels.reports.put(("fatal", 0, time.time(), {"message": message, "exit_code": exit_code,
                                                             "code": "remote"}), timeout=10)


def quiet_ray(path: str) -> None:
    """This process's stdout and stderr into `path`: Ray's client prints its nodes' log tails there (a killed
    raylet's last 20 lines, say), where the run's console has one warning line for it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def connect(address: str) -> None:
    """Join the Ray cluster at `address` as its client (this process's Ray driver), quietly."""
    import logging

    import ray

    ray.init(address=address, namespace="asyncrl", log_to_driver=False, logging_level=logging.ERROR,
             include_dashboard=False, configure_logging=False)


def run_bridge(cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: list[SharedWeights],
               channels: Channels) -> None:
    init_child("asyncrl-remote", cfg.policy_nice)
    quiet_ray(os.path.join(cfg.run_dir, "ray.log"))
    try:
        connect(cfg.ray)
    except Exception as exc:  # noqa: BLE001 - an address that stopped answering since the preflight
        report(channels, "fatal", 0, {"message": f"cannot join the Ray cluster at {cfg.ray} ({type(exc).__name__}: "
                                                 f"{exc}); check it with `ray status --address {cfg.ray}`",
                                      "exit_code": 2})
        return
    import ray

    try:
        Bridge(cfg, spec, traj, weights, channels).run()
    finally:
        ray.shutdown()
