"""Rollout worker: steps its envs, writing straight into the shared trajectory buffer.

The worker's envs form `worker_splits` groups. While one group waits for its actions from a policy worker,
the worker steps another (double buffering). For each group it owns one trajectory slot at a time; when the
slot holds `rollout` steps it goes to the learner and the worker takes a free one. No torch in this process.
"""

from __future__ import annotations

import time

from asyncrl.config import Config
from asyncrl.envs.registry import make_vec_env
from asyncrl.runtime.channels import Channels, get_or_stop, report
from asyncrl.runtime.process import init_child
from asyncrl.runtime.shared import SharedArrays

REPORT_EVERY_S = 1.0


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

    env_steps, episodes = 0, []
    t_env = t_wait = 0.0
    last_report = time.monotonic()
    while True:
        t0 = time.monotonic()
        split = get_or_stop(my_queue, channels)
        if split is None:
            break
        t1 = time.monotonic()
        slot, t = slots[split], steps[split]
        episodes.extend(envs[split].step(actions[slot, t], obs[slot, t + 1], rewards[slot, t], dones[slot, t]))
        t2 = time.monotonic()
        t_wait += t1 - t0
        t_env += t2 - t1
        env_steps += cfg.envs_per_split
        t += 1
        if t == cfg.rollout:
            channels.full.put(slot)
            new_slot = get_or_stop(channels.free, channels)
            if new_slot is None:
                break
            obs[new_slot, 0] = obs[slot, t]  # the bootstrap observation starts the next trajectory
            slot, t = new_slot, 0
            t_wait += time.monotonic() - t2
        slots[split], steps[split] = slot, t
        channels.requests.put((worker, split, slot, t))

        now = time.monotonic()
        if now - last_report >= REPORT_EVERY_S:
            report(channels, "rollout", worker, {
                "env_steps": env_steps, "episodes": [(e.ret, e.length) for e in episodes],
                "t_env": t_env, "t_wait": t_wait, "t_total": now - last_report,
            })
            env_steps, episodes, t_env, t_wait, last_report = 0, [], 0.0, 0.0, now
    _close(envs)


def _close(envs) -> None:
    for env in envs:
        env.close()

