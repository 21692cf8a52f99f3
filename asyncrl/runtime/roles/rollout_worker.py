"""Rollout worker: the rollout stage (`asyncrl.runtime.stages.rollout`) in its own process, over shared memory.

The worker's envs form `worker_splits` groups. While one group waits for its actions from a policy worker,
the worker steps another (double buffering). For each group it owns one trajectory slot at a time; when the
slot holds `rollout` steps it goes to the learner and the worker takes a free one. No torch in this process.

This file is the transport: slot indices from the free queue to the full queue, action requests and wake-ups,
the ownership records and reports. A full slot is the learner's the moment it is on the `full` queue: the stage
copies out what it still needs from it first (`hand_over`), and its pending-request marker is cleared first, so
a re-sent request cannot make a policy worker write into it. Each hand-over is recorded in `transit` (see
liveness.py), so the runner knows when a dead worker may have lost a slot.
"""

from __future__ import annotations

import time

from asyncrl.config import Config
from asyncrl.envs.base import EpisodeStats
from asyncrl.runtime.plumbing.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.plumbing.interval_stats import IntervalStats
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING, read_training_info
from asyncrl.runtime.plumbing.policy_map import PolicyMap
from asyncrl.runtime.recovery.rollout_guard import RolloutGuard
from asyncrl.runtime.roles.process import init_child
from asyncrl.runtime.stages.rollout import StageFatal, Stepped, episode_report
from asyncrl.shm import SharedArrays


class RolloutWorker:
    """One rollout worker's transport around its stage."""

    def __init__(self, worker: int, cfg: Config, traj: SharedArrays, channels: Channels):
        self.worker, self.cfg, self.channels = worker, cfg, channels
        self.guard = guard = RolloutGuard(worker, cfg, channels, traj)  # env errors, heartbeats, re-sends
        self.stage = guard.stage
        self.envs = guard.make_envs()
        self.owner, self.acted = guard.owner, guard.acted
        self.transit = channels.live["transit"]
        self.stepped, self.budget = channels.live["stepped"], channels.live["step_budget"]
        self.budget_told = False  # reported at once when the session's steps reached the --frames budget
        self.curricula = any(env.wants_training_info for env in self.envs)
        self.info_seen = 0.0
        self.policies = PolicyMap(cfg, worker, self.envs[0].spec.num_agents) if cfg.acting_policies > 1 else None
        if self.policies is not None:
            policy, first, policies = traj["policy"], traj["first"], self.policies

            def before_request(split: int, slot: int, t: int) -> None:
                policies.write(split, policy[slot, t], first[slot, t])

            guard.before_request = before_request
        self.stats = IntervalStats(channels, "rollout", worker, cfg.report_interval)
        for key in ("env_steps", "env_errors", "t_env", "t_wait", "t_wait_slot"):
            self.stats.add(key, 0)
        self.stats.extend("episodes", [])

    def run(self) -> None:
        self.waiting = list(range(self.cfg.worker_splits))  # splits without a slot, oldest first
        self.unbegun = set(self.waiting)  # each starts on its first slot with a reset
        if not self._resume_waiting():
            return self.stage.close()
        queue, serving = self.channels.actions_ready[self.worker], False
        while True:
            t0 = time.monotonic()
            split = get_or_stop(queue, self.channels, idle=self._idle)
            if split is None:
                break
            t1 = time.monotonic()
            if not serving:  # until the first actions arrive, the wait is the policy workers' start-up
                self.stats.restart()
                t0, serving = t1, True
            if split in self.waiting:  # a re-sent wake-up of a split that has handed its slot over
                continue
            slot, t = self.stage.slots[split], self.stage.steps[split]
            if self.acted[slot] != t:  # a stale or repeated wake-up: this step's actions are not written yet
                continue
            try:
                stepped = self.stage.step(split)
            except StageFatal as exc:
                self.guard.fatal(str(exc), exc.exit_code)
            self._count(split, stepped, t1 - t0, time.monotonic() - t1)
            if stepped.full:
                self._hand_over(split)
                self.guard.check_policy_restarts(skip=self.waiting)
            else:
                self.guard.request(split, slot, self.stage.steps[split])
            if self.waiting and not self._resume_waiting():
                break
            self.stats.maybe_report()
            self._tell_curricula()
        self.stats.maybe_report(force=True)  # the steps since the last report: the final record counts every step
        self.stage.close()

    def _idle(self) -> None:
        """While waiting for actions: the guard's heartbeat and re-sends, and a free slot for a waiting split."""
        self.guard.idle(skip=self.waiting)
        if self.waiting:
            self._resume_waiting()

    def _count(self, split: int, stepped: Stepped, t_wait: float, t_env: float) -> None:
        stats = self.stats
        stats.add("env_errors", stepped.env_errors)
        if stepped.finished:
            self._episodes(split, stepped.finished)
        stats.add("t_wait", t_wait)
        stats.add("t_env", t_env)
        stats.add("env_steps", stepped.agent_steps)
        self.stepped[self.worker] += stepped.agent_steps
        if not self.budget_told and 0 < self.budget[0] <= self.stepped.sum():
            stats.maybe_report(force=True)  # the runner stops on reported steps: do not keep it a second
            self.budget_told = True

    def _episodes(self, split: int, finished: list[EpisodeStats]) -> None:
        policies = self.policies
        played = [policies.of(split, e.env) for e in finished] if policies is not None else None
        if played is not None and policies.pool:  # a self-play snapshot's episodes are not the run's
            finished = [e for e, p in zip(finished, played) if policies.learning(p)]
            played = [p for p in played if policies.learning(p)]
        self.stats.extend("episodes", [episode_report(e) for e in finished])
        if played is not None:  # who played each: the map before this step's episode starts redraw it
            self.stats.extend("episode_policies", played)

    def _hand_over(self, split: int) -> None:
        """The split's slot is full: to the learner; the split waits for a free slot to continue in."""
        if self.cfg.deterministic:  # the runner counts these steps before the learner's report on them
            self.stats.maybe_report(force=True)
        slot = self.stage.hand_over(split)
        self.transit[self.worker] = slot  # handing over: ownership cleared, not yet queued
        self.owner[slot] = self.guard.want[slot] = NO_OWNER  # no request for this slot may be served from now on
        self.channels.full.put(slot)  # from here on the slot is the learner's: no more reads or writes
        self.transit[self.worker] = NO_TRANSIT
        self.waiting.append(split)

    def _resume_waiting(self) -> bool:
        """Give waiting splits the free slots there are, without blocking while another split holds a slot (its
        trajectory would age, and with few slots every worker could wait on the others); when every split
        waits, block for one. False once stopping.

        The slots bound how many splits fill at once (`local_in_flight`): a split without one waits here
        rather than outrunning the learner's lag cap."""
        while self.waiting:
            all_wait = len(self.waiting) == self.cfg.worker_splits
            slot = self._take_slot(self._wait_for_free_slot if all_wait else self._free_slot_now)
            if slot is None:
                return not self.channels.stopping
            split = self.waiting.pop(0)
            if split in self.unbegun:  # reset its envs into the slot's first row
                self.unbegun.discard(split)
                self.guard.begin(split, slot)
                continue
            self.acted[slot] = NO_OWNER
            self.stage.take_over(split, slot)
            self.guard.request(split, slot, 0)
        return True

    def _take_slot(self, take) -> int | None:
        """A free slot recorded as this worker's (the transit record covers the take); None if there was none
        (or once stopping)."""
        self.transit[self.worker] = TAKING
        slot = take()
        if slot is not None:
            self.owner[slot] = self.worker
        self.transit[self.worker] = NO_TRANSIT
        return slot

    def _free_slot_now(self) -> int | None:
        try:
            return self.channels.free.get(block=False)
        except Empty:
            return None

    def _wait_for_free_slot(self) -> int | None:
        """Block until the learner frees a slot (back-pressure), still reporting, the wait counted as it goes (an
        update longer than a report interval shows as slot waits); None once stopping."""
        channels, stats = self.channels, self.stats
        last = time.monotonic()
        while not channels.stopping:
            try:
                slot = channels.free.get(timeout=0.1)
            except Empty:
                now = time.monotonic()
                stats.add("t_wait_slot", now - last)
                last = now
                stats.maybe_report()
                continue
            stats.add("t_wait_slot", time.monotonic() - last)
            return slot
        return None

    def _tell_curricula(self) -> None:
        if self.curricula:
            self.info_seen, info = read_training_info(self.channels.live, self.info_seen)
            if info is not None:
                self.stage.tell_curricula(info)


def run_rollout_worker(worker: int, cfg: Config, traj: SharedArrays, channels: Channels) -> None:
    init_child(f"asyncrl-rollout-{worker}", cfg.rollout_nice)
    RolloutWorker(worker, cfg, traj, channels).run()
