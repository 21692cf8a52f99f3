"""The Ray transport: remote actor groups (`group.py`) on a Ray cluster feed this machine's learner.

One forked process of the run (`remote-0`, beside the rollout workers) is the Ray client. It starts
`--remote-workers` actor groups where Ray's resources place them, sends each the learner's published weights
(through Ray's object store: `ray.put` once per new version, its ref posted on a `WeightsBoard` actor that each
group asks between steps, so a group acts on weights as fresh as a local policy worker's, give or take 50 ms),
keeps two `collect` calls in flight per group so a group steps while its last slots travel, and writes each
shipped slot into a free slot of the shared trajectory buffer, then queues it for the learner: from there on the
learner cannot tell it from a local one (its `versions` column holds the version that acted, so the lag cap and
V-trace apply). A full free queue is the back-pressure: while the bridge waits for a free slot, no group gets new
calls, so at most two shipments per group wait in the object store.

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
from asyncrl.runtime.plumbing.liveness import NO_TRANSIT, TAKING
from asyncrl.runtime.roles.process import init_child
from asyncrl.shm import SharedArrays, SharedWeights

IN_FLIGHT = 2  # collect calls queued per group: one stepping, one waiting to start as the other returns
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
        self.transit = self.live["remote_transit"]
        self.stepped, self.budget = self.live["stepped"], self.live["step_budget"]
        self.budget_told = False
        self.stats = IntervalStats(channels, "remote", 0, cfg.report_interval)
        for key in ("env_steps", "env_errors", "slots", "bytes", "t_wait_slot", "t_get"):
            self.stats.add(key, 0)
        self.stats.extend("episodes", [])
        if cfg.acting_policies > 1:
            self.stats.extend("episode_policies", [])
        self.groups = [GroupState(i) for i in range(cfg.remote_workers)]
        self.pending: dict[Any, GroupState] = {}
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
        for _ in range(IN_FLIGHT):
            self._call(group)

    def _call(self, group: GroupState) -> None:
        self.pending[group.handle.collect.remote()] = group

    def _failed(self, group: GroupState, exc: Exception) -> None:
        """A group's call raised: its actor or node is gone. Restart it elsewhere, or drop it."""
        for ref, g in list(self.pending.items()):
            if g is group:
                del self.pending[ref]
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
        from asyncrl.runtime.remote.group import WeightsBoard

        self.board = self.ray.remote(WeightsBoard).options(num_cpus=0).remote()
        while not self._refresh_weights():  # the learner's first weights
            if self.channels.stopping:
                return
            self._beat()
            time.sleep(0.01)
        for group in self.groups:
            self._start(group)
        serving = False
        try:
            while not self.channels.stopping:
                self._beat()
                t0 = time.monotonic()
                ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=0.1)
                self._refresh_weights()
                for ref in ready:
                    group = self.pending.pop(ref)
                    try:
                        shipment = self.ray.get(ref)
                    except self.ray.exceptions.RayError as exc:
                        self._failed(group, exc)
                        continue
                    if not serving:  # until the first shipment, the wait is the groups' start-up
                        self.stats.restart()
                        serving = True
                    self.stats.add("t_get", time.monotonic() - t0)
                    if not self._deliver(group, shipment):
                        return
                    self._call(group)
                self._maybe_report()
        finally:
            self._maybe_report(force=True)
            for handle in [g.handle for g in self.groups] + [self.board]:
                if handle is not None:
                    self.ray.kill(handle, no_restart=True)

    def _deliver(self, group: GroupState, shipment: dict[str, Any]) -> bool:
        """Queue the shipment's slots for the learner and count its steps; False once stopping."""
        if "fatal" in shipment:
            self._fatal(shipment["fatal"], shipment.get("exit_code", 1))
            return False
        if group.node == "?":
            group.node = shipment.get("node", "?")
        for note in shipment["errors"]:
            self.live["env_errors"][self.cfg.workers] += note["count"]
            report(self.channels, "env_error", self.cfg.workers,
                   {**note, "worker": self.cfg.workers, "name": f"remote group {group.index} (node {group.node})"})
        current = self.versions[0] if self.versions else 0
        for arrays in shipment["slots"]:
            slot = self._take_slot()
            if slot is None:
                return False
            self.transit[0] = slot
            for name, a in arrays.items():
                self.traj[name][slot] = a
            self.channels.full.put(slot)
            self.transit[0] = NO_TRANSIT
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
        self.stepped[self.cfg.workers] += steps
        if not self.budget_told and 0 < self.budget[0] <= self.stepped.sum():
            self._maybe_report(force=True)  # the runner stops on reported steps
            self.budget_told = True
        return True

    def _take_slot(self) -> int | None:
        """A free slot (back-pressure: blocks while the learner holds them all); None once stopping."""
        last = time.monotonic()
        self.transit[0] = TAKING
        try:
            while not self.channels.stopping:
                self._beat()
                try:
                    return self.channels.free.get(timeout=0.1)
                except Empty:
                    now = time.monotonic()
                    self.stats.add("t_wait_slot", now - last)
                    last = now
                    self._maybe_report()
            return None
        finally:
            self.stats.add("t_wait_slot", time.monotonic() - last)

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
