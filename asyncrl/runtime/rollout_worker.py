"""Rollout worker: steps its envs, writing straight into the shared trajectory buffer.

The worker's envs form `worker_splits` groups. While one group waits for its actions from a policy worker,
the worker steps another (double buffering). For each group it owns one trajectory slot at a time; when the
slot holds `rollout` steps it goes to the learner and the worker takes a free one. No torch in this process.
"""

from __future__ import annotations

import time

from asyncrl.config import Config
from asyncrl.envs.base import EnvBroken
from asyncrl.runtime.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.interval_stats import IntervalStats
from asyncrl.runtime.liveness import NO_OWNER
from asyncrl.runtime.process import init_child
from asyncrl.runtime.rollout_guard import RolloutGuard
from asyncrl.runtime.shared import SharedArrays


def run_rollout_worker(worker: int, cfg: Config, traj: SharedArrays, channels: Channels) -> None:
    init_child(f"asyncrl-rollout-{worker}", cfg.rollout_nice)
    obs, actions, rewards, dones = traj["obs"], traj["actions"], traj["rewards"], traj["dones"]
    valid = traj["valid"]
    slots = [0] * cfg.worker_splits
    steps = [0] * cfg.worker_splits
    my_queue = channels.actions_ready[worker]
    guard = RolloutGuard(worker, cfg, channels, obs, valid, slots, steps)  # env errors, heartbeats, lost requests
    owner, want, acted = guard.owner, guard.want, guard.acted
    envs = guard.make_envs()
    faults = guard.faults()  # per split: env instances its backend replaced during the last step

    for split in range(cfg.worker_splits):
        slot = get_or_stop(channels.free, channels, idle=guard.heartbeat)
        if slot is None:
            return _close(envs)
        guard.begin(split, slot)

    stats = IntervalStats(channels, "rollout", worker)
    for key in ("env_steps", "env_errors", "t_env", "t_wait", "t_wait_slot"):
        stats.add(key, 0)
    stats.extend("episodes", [])
    while True:
        t0 = time.monotonic()
        split = get_or_stop(my_queue, channels, idle=guard.idle)
        if split is None:
            break
        t1 = time.monotonic()
        slot, t = slots[split], steps[split]
        if acted[slot] != t:  # a stale or repeated wake-up: this step's actions are not written yet
            continue
        valid[slot, t] = True
        try:
            finished = envs[split].step(actions[slot, t], obs[slot, t + 1], rewards[slot, t], dones[slot, t])
        except EnvBroken as exc:  # a fresh instance failed before its first step
            guard.fatal(str(exc))
        except Exception as exc:  # a backend that cannot replace one env: reset the split, start over
            guard.env_error(exc, "step")
            stats.add("env_errors", 1)
            guard.begin(split, slot)
            continue
        if faults[split]:
            stats.add("env_errors", guard.replaced(split, slot, t))
        t2 = time.monotonic()
        if finished:
            stats.extend("episodes", [(e.ret, e.length) for e in finished])
        stats.add("t_wait", t1 - t0)
        stats.add("t_env", t2 - t1)
        stats.add("env_steps", cfg.envs_per_split)
        t += 1
        if t == cfg.rollout:
            owner[slot] = NO_OWNER
            if cfg.deterministic:  # the runner counts these steps before the learner's report on them
                stats.maybe_report(force=True)
            channels.full.put(slot)
            new_slot = _wait_for_free_slot(channels, stats)
            if new_slot is None:
                break
            owner[new_slot], acted[new_slot] = worker, NO_OWNER
            obs[new_slot, 0] = obs[slot, t]  # the bootstrap observation starts the next trajectory
            slot, t = new_slot, 0
            stats.add("t_wait_slot", time.monotonic() - t2)
            guard.check_policy_restarts(skip=split)
        slots[split], steps[split] = slot, t
        want[slot] = t
        channels.requests.put((worker, split, slot, t))
        stats.maybe_report()
    _close(envs)


def _wait_for_free_slot(channels: Channels, stats: IntervalStats) -> int | None:
    """Block until the learner frees a slot (back-pressure), still reporting; None once stopping."""
    while not channels.stopping:
        try:
            return channels.free.get(timeout=0.1)
        except Empty:
            stats.maybe_report()
    return None


def _close(envs) -> None:
    for env in envs:
        env.close()

