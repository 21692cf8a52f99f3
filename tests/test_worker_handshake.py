"""The real worker bodies (run_rollout_worker, run_policy_worker) forked on real slots and queues, the test playing
the learner: the slot handshake, a dead worker's slots back in circulation (with the real Supervisor), spare
slots, and the stop flag."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import trace_env
from faster_fifo import Queue

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.plumbing.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING
from asyncrl.runtime.plumbing.trajectories import SPARE_SLOTS, allocate_trajectories, circulating_slots, num_slots
from asyncrl.runtime.recovery.supervisor import Supervisor
from asyncrl.runtime.roles.rollout_worker import run_rollout_worker
from asyncrl.shm import SharedArrays, SharedWeights
from tests.forked import fork, join_ok, take_all

TRACE = "trace_env:make_trace_env"  # tests/trace_env.py: observations say which env made them, and after what


def engine(**overrides: object) -> tuple[Config, EnvSpec, SharedArrays, Channels, SharedWeights]:
    """What the runner allocates before it forks: config, slots (all free), queues, and the weights."""
    settings = {"env": TRACE, "workers": 2, "envs_per_worker": 4, "worker_splits": 2, "rollout": 5,
                "batch_size": 20, "minibatches": 1, "rollout_nice": 0, "policy_nice": 0, **overrides}
    cfg = Config(**settings)
    cfg.validate()
    spec = make_env_spec(cfg.env)
    channels = Channels.create(cfg.workers, num_slots(cfg), cfg.policy_workers)
    channels.free.put_many(list(range(circulating_slots(cfg))))  # the spares stay with the supervisor
    weights = SharedWeights()

    def learner_start() -> None:  # the learner's first publication, in a child (the parent stays torch-free)
        import torch

        from asyncrl.models.actor_critic import build_model
        from asyncrl.runtime.roles.learner import WeightsPublisher

        torch.set_num_threads(1)
        WeightsPublisher(build_model(spec, cfg.hidden_size, cfg.normalize_obs), weights).publish(1)

    join_ok(fork(learner_start))
    return cfg, spec, allocate_trajectories(cfg, spec), channels, weights


def policy_worker_body(*args: object) -> None:
    from asyncrl.runtime.roles.policy_worker import run_policy_worker  # torch loads in the child only

    run_policy_worker(*args)


def start_workers(cfg: Config, spec: EnvSpec, traj: SharedArrays, channels: Channels,
                  weights: SharedWeights) -> dict[str, mp.process.BaseProcess]:
    procs = {f"policy-{i}": fork(policy_worker_body, i, cfg, spec, traj, weights, channels)
             for i in range(cfg.policy_workers)}
    procs.update({f"rollout-{w}": fork(run_rollout_worker, w, cfg, traj, channels) for w in range(cfg.workers)})
    return procs


def republish(weights: SharedWeights, version: int) -> None:
    """A new policy version (same numbers): what the learner publishes after an update."""
    flat = weights.attach()
    assert flat is not None
    weights.publish(flat.copy(), version)


def check_trajectory(snap: dict[str, np.ndarray], rollout: int) -> None:
    """One slot as the learner receives it, against what the trace env and the policy worker must have written."""
    obs, actions, rewards = snap["obs"], snap["actions"], snap["rewards"]
    dones = snap["terminated"] | snap["truncated"]
    assert set(np.unique(actions)) <= {0, 1}
    np.testing.assert_array_equal(rewards, actions)  # the trace env rewards the action it was given
    np.testing.assert_allclose(snap["logp"], np.log(0.5), atol=0.05)  # a fresh policy is near uniform
    assert (np.diff(snap["versions"]) >= 0).all(), snap["versions"]
    for t in range(rollout):
        now, nxt = obs[t], obs[t + 1]
        np.testing.assert_array_equal(nxt[:, :2], now[:, :2])  # same env (pid, instance) in every column
        for e in range(obs.shape[1]):
            if dones[t, e]:  # same-step auto-reset
                assert now[e, 2] == trace_env.EPISODE_LEN - 1 and nxt[e, 2] == 0 and nxt[e, 3] == -1, (t, e, obs)
            else:
                assert nxt[e, 2] == now[e, 2] + 1 and nxt[e, 3] == actions[t, e], (t, e, obs, actions)


def test_real_workers_fill_slots_through_the_handshake() -> None:
    """run_rollout_worker and run_policy_worker, forked as the runner forks them; the test takes full slots
    as the learner does, checks each one, hands it back, and publishes a new policy version half-way."""
    cfg, spec, traj, channels, weights = engine()
    live = channels.live
    procs = start_workers(cfg, spec, traj, channels, weights)
    received: list[dict[str, np.ndarray]] = []
    chains: dict[tuple[float, float], int] = {}  # trajectories per (worker, split), as the env's obs encodes them
    try:
        # At least 24 slots, and two from every split: on a loaded machine one niced worker may start late.
        while len(received) < 400 and (len(received) < 24 or len(chains) < cfg.workers * cfg.worker_splits
                                       or min(chains.values()) < 2):
            slot = channels.full.get(timeout=30)
            # The handshake ran for the last step, and no worker owns a full slot.
            assert live["acted"][slot] == cfg.rollout - 1
            # The worker let go of the slot before handing it over: no pending request may rewrite it.
            assert live["want"][slot] == live["slot_owner"][slot] == NO_OWNER
            received.append({name: traj[name][slot].copy() for name in traj})
            key = tuple(received[-1]["obs"][0, 0, :2])
            chains[key] = chains.get(key, 0) + 1
            channels.free.put(slot)
            if len(received) == 8:
                republish(weights, 2)
    finally:
        channels.request_stop()
        for proc in procs.values():
            join_ok(proc)
    for snap in received:
        check_trajectory(snap, cfg.rollout)
    # Each split's trajectories follow on from one another: a slot starts with the previous one's bootstrap obs.
    by_split: dict[tuple[float, float], list[dict[str, np.ndarray]]] = {}
    for snap in received:
        by_split.setdefault(tuple(snap["obs"][0, 0, :2]), []).append(snap)
    assert len(by_split) == cfg.workers * cfg.worker_splits, sorted(by_split)
    assert len({pid for pid, _ in by_split}) == cfg.workers
    for chain in by_split.values():
        for before, after in zip(chain, chain[1:]):
            np.testing.assert_array_equal(after["obs"][0], before["obs"][cfg.rollout])
            assert after["versions"][0] >= before["versions"][-1]
    versions = np.concatenate([snap["versions"] for snap in received])
    assert set(np.unique(versions)) == {1, 2}, "the policy worker must pick up the new version"


def test_a_dead_rollout_workers_slots_go_back_into_circulation() -> None:
    """SIGKILL a rollout worker mid-run; the real Supervisor restarts it. Every slot is then in at most one
    place: free, full, held by a worker (slot_owner), or held by the learner. Only a slot the worker was
    handing over when it died may be missing, and then a spare slot circulates in its place."""
    cfg, spec, traj, channels, weights = engine()
    live, circulating = channels.live, circulating_slots(cfg)
    procs = start_workers(cfg, spec, traj, channels, weights)
    supervisor = Supervisor(cfg, channels, procs, lambda name: None, out=lambda *a, **k: None)

    def respawn(name: str) -> None:
        supervisor.spawned(name)
        procs[name] = fork(run_rollout_worker, int(name.split("-")[1]), cfg, traj, channels)

    supervisor.respawn = respawn
    for name in procs:
        supervisor.spawned(name)
    supervisor.start_repair()  # as the runner does: a worker killed inside a queue operation leaves its lock held
    victim = procs["rollout-0"]
    held: list[int] = []  # full slots the "learner" has taken and not handed back
    try:
        def take(recycle: bool, timeout: float) -> int:
            try:
                got = channels.full.get_many(timeout=timeout)
            except Empty:
                return 0
            for slot in got:
                pids.add(float(traj["obs"][slot, 0, 0, 0]))
            if recycle:
                channels.free.put_many(got)
            else:
                held.extend(got)
            return len(got)

        pids: set[float] = set()
        deadline = time.monotonic() + 60
        while (len(pids) < 2 or not (live["slot_owner"] == 0).any()) and time.monotonic() < deadline:
            take(True, 0.1)  # until both workers deliver and worker 0 holds slots mid-trajectory
        assert len(pids) == 2, "the workers never delivered"
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        transit = int(live["transit"][0])  # what it was handing over when it died, if anything
        maybe_lost = transit == TAKING or (transit >= 0 and live["slot_owner"][transit] != 0)
        while supervisor.worker_restarts == 0 and time.monotonic() < deadline:
            supervisor.check()
            take(True, 0.05)
        assert supervisor.worker_restarts == 1
        new_pid = float(procs["rollout-0"].pid)
        while new_pid not in pids and time.monotonic() < deadline:  # the replacement delivers trajectories
            take(True, 0.1)
        assert new_pid in pids, "the restarted worker never filled a slot"
        while take(False, 1.0):  # stop handing slots back: the workers run out and block on `free`
            pass
    finally:
        channels.request_stop()
        for proc in procs.values():
            join_ok(proc)
        supervisor.stop_repair()
    queued_full, queued_free = take_all(channels.full), take_all(channels.free)
    owned = np.flatnonzero(live["slot_owner"] != NO_OWNER).tolist()
    everywhere = held + queued_full + queued_free + owned
    where = (transit, held, queued_full, queued_free, owned)
    assert len(set(everywhere)) == len(everywhere), where  # no slot in two places
    expected = set(range(circulating)) | ({num_slots(cfg) - 1} if maybe_lost else set())
    assert len(supervisor.spare_slots) == SPARE_SLOTS - maybe_lost
    assert set(everywhere) <= expected, where
    missing = expected - set(everywhere)
    if transit == TAKING:
        assert len(missing) <= 1, where
    else:
        assert missing <= ({transit} if maybe_lost else set()), where


def test_a_worker_dead_while_handing_a_slot_over_is_replaced_by_a_spare() -> None:
    """A rollout worker that dies between taking a slot off `free` and recording it: the supervisor cannot
    know whether the slot left the queue, so it puts a spare slot in circulation (once per spare) and says so."""
    cfg, _, _, channels, _ = engine()
    live, lines = channels.live, []
    procs: dict[str, mp.process.BaseProcess] = {}

    def die_taking(slot: int) -> None:  # the worker's own order: the transit mark, the queue, the owner record
        live["transit"][0] = TAKING
        assert channels.free.get(timeout=5) == slot
        os.kill(os.getpid(), signal.SIGKILL)

    supervisor = Supervisor(cfg, channels, procs, lambda name: supervisor.spawned(name),
                            out=lambda *a, **k: lines.append(a[0]))
    take_all(channels.free)
    spares = list(supervisor.spare_slots)
    for round_, slot in enumerate([0, 1, 2]):
        channels.free.put(slot)
        procs["rollout-0"] = fork(die_taking, slot)
        supervisor.spawned("rollout-0")
        procs["rollout-0"].join(10)
        deadline = time.monotonic() + 10
        while supervisor.worker_restarts == round_ and time.monotonic() < deadline:
            supervisor.check()  # it looks at most every 0.25 s
            time.sleep(0.05)
        assert supervisor.worker_restarts == round_ + 1
        assert live["transit"][0] == NO_TRANSIT
        if round_ < SPARE_SLOTS:
            assert take_all(channels.free) == [spares[-1 - round_]]
            assert "a spare slot stands in for it" in lines[-1], lines
        else:  # the spares are spent: the run goes on with one slot fewer
            assert take_all(channels.free) == []
            assert "spare" not in lines[-1], lines


def test_stop_flag_releases_a_blocked_child() -> None:
    channels = Channels.create(workers=1, slots=1)
    done = Queue(max_size_bytes=10_000)

    def blocked() -> None:
        assert get_or_stop(channels.free, channels, timeout=0.05) is None  # nothing will ever arrive
        done.put("released")

    proc = fork(blocked)
    time.sleep(0.3)
    assert proc.is_alive()
    channels.request_stop()
    assert done.get(timeout=5) == "released"
    join_ok(proc, timeout=5)
