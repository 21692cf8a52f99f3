"""Rollout worker: steps its envs, writing straight into the shared trajectory buffer.

The worker's envs form `worker_splits` groups. While one group waits for its actions from a policy worker,
the worker steps another (double buffering). For each group it owns one trajectory slot at a time; when the
slot holds `rollout` steps it goes to the learner and the worker takes a free one. No torch in this process.

The worker writes `first`, the envs' episode starts (after an episode end, at a split's reset, where the backend
replaced an env instance). A full slot is the learner's the moment it is on the `full` queue: everything the
worker still needs from it (the bootstrap observation that starts the next trajectory, its `first` flags and the
actor's state the policy worker wrote for it) is copied out first, and its pending-request
marker is cleared first, so a re-sent request cannot make a policy worker write into it. Each hand-over is
recorded in `transit` (see liveness.py), so the runner knows when a dead worker may have lost a slot.
"""

from __future__ import annotations

import time

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvBroken, EnvInfoError
from asyncrl.envs.dict_obs import zeros_like
from asyncrl.runtime.plumbing.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.plumbing.interval_stats import IntervalStats
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING, read_training_info
from asyncrl.runtime.plumbing.policy_map import PolicyMap
from asyncrl.runtime.plumbing.trajectories import NO_FINAL, obs_arrays, state_arrays
from asyncrl.runtime.recovery.rollout_guard import RolloutGuard
from asyncrl.runtime.roles.process import init_child
from asyncrl.shm import SharedArrays


def run_rollout_worker(worker: int, cfg: Config, traj: SharedArrays, channels: Channels) -> None:
    init_child(f"asyncrl-rollout-{worker}", cfg.rollout_nice)
    obs, actions, rewards, valid = obs_arrays(traj, "obs"), traj["actions"], traj["rewards"], traj["valid"]
    terminated, truncated, final_step = traj["terminated"], traj["truncated"], traj["final_step"]
    final_obs = obs_arrays(traj, "final_obs")  # an ArrayDict (one array per key) for a Dict observation
    first, state = traj["first"], list(state_arrays(traj).values())  # no state arrays for a feed-forward actor
    # Per split: the backend's final observations of truncated envs, and the bootstrap row in transit (the
    # observation, its episode-start flags and the actor's state).
    final_scratch = [zeros_like(obs[0, 0]) for _ in range(cfg.worker_splits)]
    carry = [zeros_like(obs[0, 0]) for _ in range(cfg.worker_splits)]
    carry_first = [np.zeros_like(first[0, 0]) for _ in range(cfg.worker_splits)]
    carry_state = [[np.zeros_like(a[0, 0]) for a in state] for _ in range(cfg.worker_splits)]
    slots = [0] * cfg.worker_splits
    steps = [0] * cfg.worker_splits
    my_queue = channels.actions_ready[worker]
    guard = RolloutGuard(worker, cfg, channels, obs, valid, slots, steps, first)  # env errors, heartbeats, ...
    owner, want, acted = guard.owner, guard.want, guard.acted
    envs = guard.make_envs()
    faults = guard.faults()  # per split: env instances its backend replaced during the last step
    policies = PolicyMap(cfg, worker, envs[0].spec.num_agents) if cfg.acting_policies > 1 else None
    if policies is not None:
        policy = traj["policy"]

        def before_request(split: int, slot: int, t: int) -> None:
            policies.write(split, policy[slot, t], first[slot, t])

        guard.before_request = before_request

    transit = channels.live["transit"]
    for split in range(cfg.worker_splits):
        transit[worker] = TAKING
        slot = get_or_stop(channels.free, channels, idle=guard.heartbeat)
        if slot is None:
            return _close(envs)
        owner[slot], transit[worker] = worker, NO_TRANSIT
        final_step[slot] = NO_FINAL
        guard.begin(split, slot)

    stats = IntervalStats(channels, "rollout", worker, cfg.report_interval)
    for key in ("env_steps", "env_errors", "t_env", "t_wait", "t_wait_slot"):
        stats.add(key, 0)
    stats.extend("episodes", [])
    serving = False  # until the first actions arrive, the wait is the policy workers' start-up, not a stage
    stepped, budget = channels.live["stepped"], channels.live["step_budget"]
    budget_told = False  # reported at once when the session's steps reached the --frames budget
    curricula = [split for split, env in enumerate(envs) if env.wants_training_info]
    info_seen = 0.0
    while True:
        t0 = time.monotonic()
        split = get_or_stop(my_queue, channels, idle=guard.idle)
        if split is None:
            break
        t1 = time.monotonic()
        if not serving:
            stats.restart()
            t0, serving = t1, True
        slot, t = slots[split], steps[split]
        if acted[slot] != t:  # a stale or repeated wake-up: this step's actions are not written yet
            continue
        valid[slot, t] = True
        try:
            finished = envs[split].step(actions[slot, t], obs[slot, t + 1], rewards[slot, t], terminated[slot, t],
                                        truncated[slot, t], final_scratch[split])
        except EnvInfoError as exc:  # bad input: a metric that is not a number
            guard.fatal(str(exc), exit_code=2)
        except EnvBroken as exc:  # a fresh instance failed before its first step
            guard.fatal(str(exc))
        except Exception as exc:  # a backend that cannot replace one env: reset the split, start over
            guard.env_error(exc, "step")
            stats.add("env_errors", 1)
            final_step[slot] = NO_FINAL
            guard.begin(split, slot)
            continue
        np.logical_or(terminated[slot, t], truncated[slot, t], out=first[slot, t + 1])  # episode ends -> starts
        agent_steps = cfg.envs_per_split
        skipped = envs[split].skipped
        if skipped is not None and skipped.any():  # the env's own reset steps (NEXT_STEP): not agent steps
            agent_steps -= skip_reset_rows(skipped, valid[slot, t], first[slot, t + 1])
        if faults[split]:
            stats.add("env_errors", guard.replaced(split, slot, t))
        t2 = time.monotonic()
        if finished:
            _keep_final_obs(slot, t, truncated, final_scratch[split], final_obs, final_step)
            played = [policies.of(split, e.env) for e in finished] if policies is not None else None
            if played is not None and policies.pool:  # a self-play snapshot's episodes are not the run's
                finished = [e for e, p in zip(finished, played) if policies.learning(p)]
                played = [p for p in played if policies.learning(p)]
            stats.extend("episodes", [(e.ret, e.length, e.truncated) if e.extra is None else
                                      (e.ret, e.length, e.truncated, e.extra) for e in finished])
            if played is not None:  # who played each: the map before this step's episode starts redraw it
                stats.extend("episode_policies", played)
        stats.add("t_wait", t1 - t0)
        stats.add("t_env", t2 - t1)
        stats.add("env_steps", agent_steps)
        stepped[worker] += agent_steps
        if not budget_told and 0 < budget[0] <= stepped.sum():
            stats.maybe_report(force=True)  # the runner stops on reported steps: do not keep it a second
            budget_told = True
        t += 1
        if t == cfg.rollout:
            carry[split][...] = obs[slot, t]  # the bootstrap observation starts the next trajectory
            carry_first[split][...] = first[slot, t]
            for kept, a in zip(carry_state[split], state):
                kept[...] = a[slot, t]
            if cfg.deterministic:  # the runner counts these steps before the learner's report on them
                stats.maybe_report(force=True)
            transit[worker] = slot  # handing over: ownership cleared, not yet queued
            owner[slot] = want[slot] = NO_OWNER  # no request for this slot may be served from now on
            channels.full.put(slot)  # from here on the slot is the learner's: no more reads or writes
            transit[worker] = TAKING
            new_slot = _wait_for_free_slot(channels, stats)
            if new_slot is None:
                break
            owner[new_slot], transit[worker] = worker, NO_TRANSIT
            acted[new_slot] = NO_OWNER
            final_step[new_slot] = NO_FINAL
            obs[new_slot, 0] = carry[split]
            first[new_slot, 0] = carry_first[split]
            for kept, a in zip(carry_state[split], state):
                a[new_slot, 0] = kept
            slot, t = new_slot, 0
            guard.check_policy_restarts(skip=split)
        slots[split], steps[split] = slot, t
        want[slot] = t
        guard.before_request(split, slot, t)
        channels.requests.put((worker, split, slot, t))
        stats.maybe_report()
        if curricula:
            info_seen, info = read_training_info(channels.live, info_seen)
            if info is not None:
                for s in curricula:
                    envs[s].set_training_info(info)
    stats.maybe_report(force=True)  # the steps since the last report: the run's final record counts every step
    _close(envs)


def skip_reset_rows(skipped: np.ndarray, valid: np.ndarray, first: np.ndarray) -> int:
    """Leave the rows of a reset step out of training and start their episodes at the next observation; how many."""
    np.logical_and(valid, ~skipped, out=valid)
    np.logical_or(first, skipped, out=first)
    return int(skipped.sum())


def _keep_final_obs(slot: int, t: int, truncated: np.ndarray, scratch: np.ndarray, final_obs: np.ndarray,
                    final_step: np.ndarray) -> None:
    """Store the final observation of each env truncated at step t, if it is the env's first in the slot."""
    first = truncated[slot, t] & (final_step[slot] == NO_FINAL)
    if first.any():
        final_obs[slot, first] = scratch[first]
        final_step[slot, first] = t


def _wait_for_free_slot(channels: Channels, stats: IntervalStats) -> int | None:
    """Block until the learner frees a slot (back-pressure), still reporting, the wait counted as it goes (an
    update longer than a report interval shows as slot waits); None once stopping."""
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


def _close(envs) -> None:
    for env in envs:
        env.close()

