"""Learner process: feeds full trajectory slots to the learner that `--algo` names and publishes its policy.

Process loop: take `trajectories_per_batch` full slot indices, copy the slots out of shared memory (then
hand the slots straight back to the rollout workers), `train` on them, then publish the learner's
`policy_module()` as its new policy version. An update waits while it would make a slot that a rollout worker is
still filling staler than `--max-policy-lag` (`LagGate`); also checkpoints, resume and the stop on non-finite updates.
What an update does is the learner's own business (`asyncrl.agents`); this file is only process plumbing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from asyncrl.agents.base import Learner
from asyncrl.agents.batch import Batch
from asyncrl.agents.registry import make_learner
from asyncrl.config import Config, member_config, member_settings, policy_settings
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.distributed.group import Group, join_group
from asyncrl.runtime.distributed.rank import DataParallel
from asyncrl.runtime.host.seeding import write_initial_weights_checksum
from asyncrl.runtime.plumbing.channels import Channels, Empty, Full, report
from asyncrl.runtime.plumbing.lag_gate import LagGate
from asyncrl.runtime.plumbing.liveness import busy_beating
from asyncrl.runtime.roles.process import init_child
from asyncrl.runtime.stages.learner_state import (
    NONFINITE_LIMIT,
    Resumed,
    ResumeError,
    learner_threads,
    load_resume_state,
    nonfinite_message,
    read_resume_state,
    set_up_torch,
    try_save,
)
from asyncrl.runtime.stages.learning import LearnerStage, WeightsPublisher
from asyncrl.shm import SharedArrays, SharedWeights

__all__ = ["LearnerLoop", "NONFINITE_LIMIT", "ResumeError", "Resumed", "SnapshotPool", "WeightsPublisher",
           "learner_threads", "load_resume_state", "nonfinite_message", "read_resume_state", "run_learner",
           "set_up_torch"]

GATE_POLL_S = 0.002  # how often a held update looks again at the slots still filling (`LagGate`)


def run_learner(cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: list[SharedWeights] | SharedWeights,
                channels: Channels, ranks: DataParallel | None = None) -> None:
    """The learner process: build the learner (one per policy with --num-policies; resumed, and under torchrun
    joined to the other ranks' learners), publish its first weights, then train on every batch until the
    runner's stop command."""
    weights = weights if isinstance(weights, list) else [weights]
    init_child("asyncrl-learner")
    device = set_up_torch(cfg, spec.batched)
    learners = [make_learner(member_config(cfg, s), spec, device) for s in policy_settings(cfg)]
    learner = learners[0]
    weights, pool_blocks = weights[:cfg.num_policies], weights[cfg.num_policies:]  # --self-play: the snapshots
    start = _resume(cfg, learners, channels)
    if start is None:
        return  # reported as fatal; the runner has stopped the run
    env_steps, run_state = start.env_steps, start.run
    group = _join(ranks, learner, channels)
    publishers = [_publish_first(cfg, m, w, checksum=p == 0) for p, (m, w) in enumerate(zip(learners, weights))]
    with busy_beating(channels.live, "beat_learner", 0):
        warm = _warm_up(learners, channels)
    if not warm:  # the workers sample the first batch meanwhile (weights are published)
        return  # reported as fatal; the runner has stopped the run
    report(channels, "ready", 0, {"version": learner.version, "env_steps": env_steps, "run": run_state,
                                  "stats": list(learner.stat_names),
                                  "policies": [member_settings(m.cfg) for m in learners]})
    beat = channels.live["beat_learner"]
    for member in learners:  # long train() calls show progress inside
        member.heartbeat = lambda: beat.__setitem__(0, time.monotonic())
    pool = SnapshotPool(cfg, learners, pool_blocks) if pool_blocks else None
    if pool is not None and start.pool is not None:
        problem = pool.restore(start.pool)
        report(channels, "info" if problem is None else "warning", 0, {"message": problem or (
            f"self-play: the pool of {len(pool_blocks)} snapshots resumed as it was saved")})
    save = _checkpointer(cfg, learners, publishers, channels, pool)
    if group is not None:
        save = group.wrap_save(save)  # only rank 0 saves, with the group's totals
    LearnerLoop(cfg, spec, traj, device, learners, publishers, channels, group, save, env_steps, pool).run()


class SnapshotPool:
    """--self-play's opponents: past versions of the learning policies in the pool's weights blocks. Block j holds
    snapshots of policy j mod N; every block starts with its policy's first weights, and each policy's newest
    snapshot (every --self-play-every versions) replaces the oldest of its blocks. Checkpoints keep the pool
    (`state`), and a resumed run plays against it as it was (`restore`)."""

    def __init__(self, cfg: Config, learners: list[Learner], blocks: list[SharedWeights]) -> None:
        n = len(learners)
        self.every = cfg.self_play_every
        self.publishers = [WeightsPublisher(learners[j % n].policy_module(), b) for j, b in enumerate(blocks)]
        self.versions = [1] * len(blocks)
        for publisher in self.publishers:
            publisher.publish(1)
        self.blocks_of = [[j for j in range(len(blocks)) if j % n == p] for p in range(n)]
        self.taken = [0] * n
        self.due = [m.version + self.every for m in learners]

    def state(self) -> dict:
        """The snapshots (flat float32 weights, as published), their versions and each policy's schedule."""
        return {"weights": [p.staging.clone() for p in self.publishers], "versions": list(self.versions),
                "taken": list(self.taken), "due": list(self.due)}

    def restore(self, saved: dict) -> str | None:
        """Publish a checkpoint's snapshots into the pool's blocks; why not (the pool starts afresh) or None."""
        weights = saved.get("weights", [])
        if len(weights) != len(self.publishers) or len(saved.get("due", [])) != len(self.due) or any(
                w.numel() != p.staging.numel() for w, p in zip(weights, self.publishers)):
            return (f"self-play: the checkpoint's pool ({len(weights)} snapshots) does not fit this run's "
                    f"({len(self.publishers)}); the pool starts again from the resumed weights")
        # each block under a version it has not had yet: a policy worker that read the fresh pool's first weights
        # must see the change
        self.versions = [max(int(v), mine) + 1 for v, mine in zip(saved["versions"], self.versions)]
        for publisher, w, version in zip(self.publishers, weights, self.versions):
            publisher.staging.copy_(w.reshape(-1))
            publisher.weights.publish(publisher.staging.numpy(), version)
        self.taken, self.due = [int(t) for t in saved["taken"]], [int(d) for d in saved["due"]]
        return None

    def after_update(self, policy: int, learner: Learner) -> None:
        """Snapshot `policy` into its oldest block once it is --self-play-every versions past the last one."""
        if learner.version < self.due[policy] or not self.blocks_of[policy]:
            return
        self.due[policy] = learner.version + self.every
        blocks = self.blocks_of[policy]
        j = blocks[self.taken[policy] % len(blocks)]
        self.taken[policy] += 1
        self.versions[j] += 1
        self.publishers[j].publish(self.versions[j])


def _resume(cfg: Config, learner: list[Learner], channels: Channels) -> Resumed | None:
    """With --resume, load the newest good checkpoint into `learner` and say what else it kept (a fresh start:
    nothing); None after a fatal report."""
    if not cfg.resume:
        return Resumed("", 0, {}, None)
    try:
        resumed = load_resume_state(cfg, learner, lambda msg: report(channels, "warning", 0, {"message": msg}))
    except ResumeError as exc:
        return _fatal(channels, {"message": str(exc), "hint": False})
    report(channels, "info", 0, {"message": f"resumed from {resumed.path}"})
    return resumed


def _warm_up(learners: list[Learner], channels: Channels) -> bool:
    """--compile learner|all: compile each learner's update now (the policy workers already sample on the first
    weights), with a progress line before and after; False after a fatal report (torch cannot compile it)."""
    warm_ups = [getattr(m, "warm_up", None) for m in learners if getattr(m, "compiled", False)]
    if not warm_ups:
        return True
    from asyncrl.agents.compiled import CompileError, cache_dir

    report(channels, "info", 0, {"message": f"compiling the learner's update (cache {cache_dir()})..."})
    try:
        seconds = sum(warm_up() or 0.0 for warm_up in warm_ups if warm_up is not None)
    except CompileError as exc:
        _fatal(channels, {"message": str(exc), "hint": False, "exit_code": 2})
        return False
    report(channels, "info", 0, {"message": f"learner's update compiled in {seconds:.1f} s"})
    return True


def _join(ranks: DataParallel | None, learner: Learner, channels: Channels) -> Group | None:
    """Under torchrun: join the other ranks' learners, take rank 0's state, and hook the learner's gradient
    averaging and update count into the group. None (the learner's own no-op hooks stay) otherwise."""
    if ranks is None:
        return None
    group = join_group(ranks, learner, channels)
    learner.sync_gradients = group.average_gradients
    learner.agree_updates = group.min_int  # off-policy learners: the same update count on every rank
    return group


def _publish_first(cfg: Config, learner: Learner, weights: SharedWeights, checksum: bool = True) -> WeightsPublisher:
    """Publish the starting weights as version 1 or later (and record their checksum on a fresh start)."""
    publisher = WeightsPublisher(learner.policy_module(), weights)
    learner.version = max(learner.version, 1)
    publisher.publish(learner.version)
    if checksum and not cfg.resume:
        try:
            write_initial_weights_checksum(cfg.run_dir, publisher.staging.numpy())
        except OSError:
            pass  # only a record for comparing runs; the run itself does not need it
    return publisher


def _checkpointer(cfg: Config, learners: list[Learner], publishers: list[WeightsPublisher],
                  channels: Channels, pool: SnapshotPool | None = None) -> Callable[[int, dict], None]:
    """`save(env_steps, run_state)`: a checkpoint of the learner (every policy's, and the self-play pool), unless
    its weights are not finite; a failed write is reported and training goes on."""

    def save(steps: int, run: dict) -> None:
        kind, payload = try_save(cfg, learners, [t for p in publishers for t in p.tensors], steps, run,
                                 pool=None if pool is None else pool.state())
        report(channels, kind, 0, payload)

    return save


class LearnerLoop:
    """The learner's main loop: serve the runner's commands, gather `trajectories_per_batch` full slots, train on
    them and publish, until the stop command (or the stop on non-finite updates).

    With several policies (`--num-policies`) each trains in turn on its own rows of the batch (the env columns
    it acted in), publishes its own weights and reports its own stats; PBT's exploit commands copy one policy
    into another between batches."""

    def __init__(self, cfg: Config, spec: EnvSpec, traj: SharedArrays, device: torch.device,
                 learners: Learner | list[Learner], publishers: WeightsPublisher | list[WeightsPublisher],
                 channels: Channels, group: Group | None, save: Callable[[int, dict], None], env_steps: int,
                 pool: SnapshotPool | None = None):
        self.learners = learners if isinstance(learners, list) else [learners]
        self.publishers = publishers if isinstance(publishers, list) else [publishers]
        self.learner, self.publisher = self.learners[0], self.publishers[0]
        self.cfg, self.spec, self.traj, self.device = cfg, spec, traj, device
        self.channels, self.group, self.save = channels, group, save
        self.pool = pool  # --self-play
        self.beat = channels.live["beat_learner"]
        self.env_steps = env_steps  # the runner's count, from its commands
        # env steps in the batches taken so far (in lockstep, every step the workers made)
        self.stage = LearnerStage(spec, traj, device, self.learners, self.publishers, collected=env_steps)
        if group is not None:
            self.stage.agree = lambda member, stats: group.agree(member, stats, channels)
        if pool is not None:
            self.stage.after_update = pool.after_update
        self.pending: list[int] = []
        self.t_wait, self.fed = 0.0, False
        self.gate = LagGate(cfg, traj, channels.live)

    def run(self) -> None:
        while True:
            self.beat[0] = time.monotonic()
            if self._serve_command():
                return
            if self.channels.stopping:
                continue  # the runner's stop command (with the final env-step count) follows
            if not self._collect():
                continue
            if not self.cfg.train:
                self._recycle_untrained()
                continue
            if self.gate.active and not self._gate_open():
                continue
            batch = self._update()
            diverged = next((m for m in self.learners if m.nonfinite_streak >= NONFINITE_LIMIT), None)
            if diverged is not None:
                _stop_nonfinite(self.channels, diverged, batch)
                return _final_save(self.channels, self.save)

    def _serve_command(self) -> bool:
        """A save or stop command from the runner (both checkpoint); True for stop."""
        command = _next_command(self.channels)
        if command is None:
            return False
        if command[0] == "pbt":  # ("pbt", into, source, settings): exploit and explore
            _, into, source, settings = command
            self.learners[into].adopt(self.learners[source])
            self.learners[into].retune(member_config(self.cfg, settings))
            self.publishers[into].publish(self.learners[into].version)
            return False
        name, steps, *extra = command
        if name == "stop" and len(extra) > 1 and extra[1]:
            self._train_collected()
        self.env_steps = max(self.env_steps, steps)
        self.save(self.env_steps, extra[0] if extra else {})
        return name == "stop"

    def _train_collected(self) -> None:
        """At a --frames stop: train on every whole batch of trajectories finished before it, so that a budget of a
        batch (plus the slots still filling) ends with that batch trained on. Not under torchrun, whose ranks
        must take the same number of updates."""
        if not self.cfg.train or self.group is not None:
            return
        k = self.cfg.trajectories_per_batch
        while True:
            try:
                if len(self.pending) < k:
                    self.pending.extend(self.channels.full.get_many(block=False,
                                                                    max_messages_to_get=k - len(self.pending)))
            except Empty:
                return
            if len(self.pending) >= k:
                self._update()
                if any(m.nonfinite_streak >= NONFINITE_LIMIT for m in self.learners):
                    return

    def _collect(self) -> bool:
        """Take full slots off the queue for a short while; True once a whole batch is pending."""
        k = self.cfg.trajectories_per_batch
        if len(self.pending) >= k:  # held by the lag gate
            return True
        t0 = time.monotonic()
        try:
            self.pending.extend(self.channels.full.get_many(timeout=0.05, max_messages_to_get=k - len(self.pending)))
        except Empty:
            self.t_wait += (time.monotonic() - t0) if self.fed else 0.0  # before the first trajectory: start-up
            return False
        self.t_wait += (time.monotonic() - t0) if self.fed else 0.0
        self.fed = True
        return len(self.pending) >= k

    def _gate_open(self) -> bool:
        """Whether the next update may go (`LagGate`): the oldest slots held go first, with any that came in while the
        update was held; otherwise wait a moment (counted as waiting for trajectories)."""
        try:
            self.pending.extend(self.channels.full.get_many(block=False))
        except Empty:
            pass
        self.pending = self.gate.oldest_first(self.pending)
        if self.gate.ready(self.learner.version, self.pending[:self.cfg.trajectories_per_batch]):
            return True
        t0 = time.monotonic()
        time.sleep(GATE_POLL_S)
        self.t_wait += time.monotonic() - t0
        return False

    def _recycle_untrained(self) -> None:
        """Sampling-only run: hand the trajectories back untouched."""
        cfg = self.cfg
        self.channels.give_back(self.pending)
        report(self.channels, "learner", 0, {"samples": len(self.pending) * cfg.rollout * cfg.envs_per_split,
                                             "t_wait": self.t_wait, "t_copy": 0.0, "t_train": 0.0})
        self.pending, self.t_wait = [], 0.0

    def _update(self) -> Batch:
        """Copy the pending slots out, train on them, agree with the other ranks, publish and report."""
        t1 = time.monotonic()
        k = self.cfg.trajectories_per_batch
        slots, self.pending = self.pending[:k], self.pending[k:]  # more than k only when the lag gate took them
        batch = self.stage.gather(slots)
        if self.gate.active:
            self.gate.taken(slots)
        if not self.cfg.deterministic:  # hand the slots straight back; in lockstep only after publishing (below)
            self.channels.give_back(slots)
        for stats in self.stage.train(batch, {"t_wait": self.t_wait, "t_copy": time.monotonic() - t1}):
            report(self.channels, "learner", stats.get("policy", 0), stats)
        self.t_wait = 0.0
        self._release_lockstep(slots)
        return batch

    def _release_lockstep(self, slots: list[int]) -> None:
        """Lockstep (--deterministic): the next batch is collected by the version just published, and its rollout
        reports reach the runner after this update's report. At --frames the slots are kept, so no update follows
        the one the runner stops on and the final checkpoint is the same in every run."""
        cfg = self.cfg
        if cfg.deterministic and not (cfg.frames and self.stage.collected * self.spec.frameskip >= cfg.frames):
            self.channels.give_back(slots)


def _stop_nonfinite(channels: Channels, learner: Learner, batch: Batch) -> None:
    """Report the divergence as fatal. The skipped steps left the weights as they were, so the final save at the
    runner's stop keeps them (`save` refuses non-finite weights)."""
    _fatal(channels, {"message": nonfinite_message(learner, batch), "code": "nonfinite"})


def _fatal(channels: Channels, payload: dict) -> None:
    """Report a fatal error, then wait for the runner's stop: exiting at once could make the runner see a dead
    learner ("exited unexpectedly") before it reads the message."""
    try:
        channels.reports.put(("fatal", 0, time.time(), payload), timeout=10)  # unlike report(): never dropped
    except Full:
        return  # the runner is not reading; it will find this process gone
    while not channels.stopping:
        time.sleep(0.05)


def _final_save(channels: Channels, save, timeout: float = 5.0) -> None:
    """After a fatal report: serve the runner's stop command (a final checkpoint if the weights are finite)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        command = _next_command(channels)
        if command is not None and command[0] == "stop":
            _, steps, *extra = command
            save(steps, extra[0] if extra else {})
            return
        time.sleep(0.02)


def _next_command(channels: Channels) -> tuple[str, int] | None:
    try:
        return channels.learner_cmds.get(block=False)
    except Empty:
        return None
