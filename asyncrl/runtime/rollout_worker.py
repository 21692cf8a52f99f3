"""Rollout worker: steps its envs, writing straight into the shared trajectory buffer.

The worker's envs form `worker_splits` groups. While one group waits for its actions from a policy worker,
the worker steps another (double buffering). For each group it owns one trajectory slot at a time; when the
slot holds `rollout` steps it goes to the learner and the worker takes a free one. No torch in this process.
"""

from __future__ import annotations

import time

from asyncrl.config import Config
from asyncrl.envs.registry import make_vec_env
from asyncrl.runtime.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.interval_stats import IntervalStats
from asyncrl.runtime.process import init_child
from asyncrl.runtime.shared import SharedArrays


def run_rollout_worker(worker: int, cfg: Config, traj: SharedArrays, channels: Channels) -> None:
    init_child(f"asyncrl-rollout-{worker}")
    envs = [
        make_vec_env(cfg.env, cfg.envs_per_split, training=True, num_threads=cfg.env_threads)
        for _ in range(cfg.worker_splits)
    ]
    obs, actions, rewards, dones = traj["obs"], traj["actions"], traj["rewards"], traj["dones"]
    slots = [0] * cfg.worker_splits
    steps = [0] * cfg.worker_splits
    my_queue = channels.actions_ready[worker]

    for split, env in enumerate(envs):
        slot = get_or_stop(channels.free, channels)
        if slot is None:
            return _close(envs)
        slots[split] = slot
        env.reset(seed=cfg.seed * 1_000_003 + (worker * cfg.worker_splits + split) * cfg.envs_per_split,
                  obs_out=obs[slot, 0])
        channels.requests.put((worker, split, slot, 0))

    stats = IntervalStats(channels, "rollout", worker)
    for key in ("env_steps", "t_env", "t_wait", "t_wait_slot"):
        stats.add(key, 0)
    stats.extend("episodes", [])
    while True:
        t0 = time.monotonic()
        split = get_or_stop(my_queue, channels)
        if split is None:
            break
        t1 = time.monotonic()
        slot, t = slots[split], steps[split]
        finished = envs[split].step(actions[slot, t], obs[slot, t + 1], rewards[slot, t], dones[slot, t])
        t2 = time.monotonic()
        if finished:
            stats.extend("episodes", [(e.ret, e.length) for e in finished])
        stats.add("t_wait", t1 - t0)
        stats.add("t_env", t2 - t1)
        stats.add("env_steps", cfg.envs_per_split)
        t += 1
        if t == cfg.rollout:
            channels.full.put(slot)
            new_slot = _wait_for_free_slot(channels, stats)
            if new_slot is None:
                break
            obs[new_slot, 0] = obs[slot, t]  # the bootstrap observation starts the next trajectory
            slot, t = new_slot, 0
            stats.add("t_wait_slot", time.monotonic() - t2)
        slots[split], steps[split] = slot, t
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

