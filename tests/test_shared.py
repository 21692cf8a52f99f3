"""Shared buffers, the weights seqlock, the queues and the real worker bodies in forked processes; Config.validate."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable

import numpy as np
import pytest
import trace_env
from faster_fifo import Queue

from asyncrl import shm as shared
from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.plumbing.channels import Channels, Empty, get_or_stop
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING
from asyncrl.runtime.plumbing.trajectories import SPARE_SLOTS, allocate_trajectories, circulating_slots, num_slots
from asyncrl.runtime.recovery.supervisor import Supervisor
from asyncrl.runtime.roles.rollout_worker import run_rollout_worker
from asyncrl.shm import SharedArrays, SharedWeights

FORK = mp.get_context("fork")


def fork(target: Callable[..., None], *args: object) -> mp.process.BaseProcess:
    """Run target in a forked child; an exception there becomes a non-zero exit code."""

    def main() -> None:
        try:
            target(*args)
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)

    proc = FORK.Process(target=main, daemon=True)
    proc.start()
    return proc


def join_ok(proc: mp.process.BaseProcess, timeout: float = 20.0) -> None:
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("child process hung")
    assert proc.exitcode == 0, f"child failed with exit code {proc.exitcode} (its traceback is on stderr)"


def take_all(q: Queue) -> list:
    try:
        return q.get_many(block=False)
    except Empty:
        return []


# --- SharedArrays + faster-fifo ---------------------------------------------------------------------------


def test_shared_arrays_round_trip_across_processes() -> None:
    layout = {
        "obs": ((6, 3, 84, 84), np.dtype(np.uint8)),
        "reward": ((6, 3), np.dtype(np.float32)),
        "done": ((6, 3), np.dtype(np.bool_)),
        "version": ((6,), np.dtype(np.int64)),
    }
    arrays = SharedArrays(layout)
    for name, (shape, dtype) in layout.items():
        assert arrays[name].shape == shape and arrays[name].dtype == dtype
        assert arrays[name].ctypes.data % 64 == 0  # cache-line aligned
    arrays["obs"][0] = 7  # parent -> child
    to_parent, to_child = Queue(max_size_bytes=100_000), Queue(max_size_bytes=100_000)

    def child() -> None:
        assert (arrays["obs"][0] == 7).all(), "child does not see the parent's write"
        for slot in (5, 2, 3):
            arrays["obs"][slot] = slot + 10
            arrays["reward"][slot] = np.arange(3) * slot
            arrays["done"][slot] = [True, False, True]
            arrays["version"][slot] = 1000 + slot
            to_parent.put((slot, int(arrays["version"][slot])))
        slot = to_child.get(timeout=10)  # parent writes, then hands the index back
        assert arrays["version"][slot] == -slot and (arrays["obs"][slot] == 99).all()
        to_parent.put(("ack", slot))

    proc = fork(child)
    got = [to_parent.get(timeout=10) for _ in range(3)]
    assert got == [(5, 1005), (2, 1002), (3, 1003)]
    for slot, version in got:
        assert (arrays["obs"][slot] == slot + 10).all()
        np.testing.assert_array_equal(arrays["reward"][slot], np.arange(3, dtype=np.float32) * slot)
        np.testing.assert_array_equal(arrays["done"][slot], [True, False, True])
        assert arrays["version"][slot] == version
    assert (arrays["obs"][1] == 0).all() and arrays["version"][1] == 0  # untouched slots stay zero
    arrays["obs"][4] = 99
    arrays["version"][4] = -4
    to_child.put(4)
    assert to_parent.get(timeout=10) == ("ack", 4)
    join_ok(proc)


# --- the real worker bodies on real slots and queues; the test plays the learner -------------------------

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


# --- SharedWeights seqlock --------------------------------------------------------------------------------


def test_weights_published_by_one_child_are_read_whole_by_another() -> None:
    """Learner-like writer and policy-worker-like reader, both forked; no torn copy may be accepted."""
    numel, versions = 1 << 20, 60  # 4 MiB: a copy takes long enough for readers to collide with writes
    weights = SharedWeights()
    results = Queue(max_size_bytes=1_000_000)

    def learner() -> None:
        flat = weights.allocate(numel)
        assert flat.shape == (numel,)
        source = np.empty(numel, dtype=np.float32)
        for version in range(1, versions + 1):
            source.fill(version)
            weights.publish(source, version)
            assert weights.version == version

    def policy_worker() -> None:
        dest = np.empty(numel, dtype=np.float32)
        seen, torn, last = [], 0, 0
        deadline = time.monotonic() + 15
        while last < versions and time.monotonic() < deadline:
            version = weights.read_into(dest)
            if version is None:
                torn += 1
                continue
            assert dest[0] == dest[-1] == version and (dest == version).all(), f"torn copy accepted as {version}"
            assert version >= last, "versions went backwards"
            if version != last:
                seen.append(version)
            last = version
        results.put((seen, torn))

    reader = fork(policy_worker)
    writer = fork(learner)
    join_ok(writer)
    join_ok(reader)
    seen, _torn = results.get(timeout=5)
    assert seen and seen[-1] == versions
    # The parent was forked before allocation; it attaches lazily through the inherited memfd.
    dest = np.zeros(numel, dtype=np.float32)
    assert weights.version == versions
    assert weights.read_into(dest) == versions and (dest == versions).all()
    os.close(weights.fd)


def test_readers_spinning_on_a_held_write_never_accept_a_copy() -> None:
    """The writer stops half-way through publishing version 2 (sequence odd, half the vector new) while forked
    readers spin: every read in that window must be refused, and after the writer finishes they get version 2
    whole."""
    numel = 1 << 16
    weights = SharedWeights()
    flat = weights.allocate(numel)
    weights.publish(np.ones(numel, dtype=np.float32), 1)
    results = Queue(max_size_bytes=100_000)
    weights._ctl["seq"][0] = 3  # publish(..., 2), held half-way: odd sequence, first half already new
    flat[: numel // 2] = 2.0

    def reader() -> None:
        dest = np.empty(numel, dtype=np.float32)
        refused = 0
        while (version := weights.read_into(dest)) is None:
            refused += 1
        assert (dest == dest[0]).all(), f"torn copy accepted as version {version}"
        results.put((refused, version, float(dest[0])))

    readers = [fork(reader) for _ in range(2)]
    time.sleep(0.5)  # the readers spin against the held write
    flat[numel // 2:] = 2.0
    weights._ctl["stamp"][0] = np.uint64(2 << 32 | shared._crc(flat, 2))  # the rest of publish(..., 2)
    weights._ctl["seq"][0] = 4
    for proc in readers:
        join_ok(proc)
    for _ in readers:
        refused, version, value = results.get(timeout=5)
        assert refused > 0 and version == 2 and value == 2.0, (refused, version, value)
    os.close(weights.fd)


class PublishDuringCopy(np.ndarray):
    """A destination array whose next `np.copyto` into it first runs `writer`: a write that overlaps the copy."""

    writer: Callable[[], None] | None = None

    def __array_function__(self, func, types, args, kwargs):
        if func is np.copyto and self.writer is not None:
            writer, self.writer = self.writer, None
            writer()
        return super().__array_function__(func, types, args, kwargs)


def test_a_read_that_overlaps_a_write_is_detected_and_retried() -> None:
    """A read that starts on a complete version (even sequence) while the learner begins writing during the copy:
    the sequence changed, so the copy is refused, and the next read returns the new version whole."""
    numel = 1 << 12
    weights = SharedWeights()
    flat = weights.allocate(numel)
    weights.publish(np.ones(numel, dtype=np.float32), 1)
    dest = np.zeros(numel, dtype=np.float32).view(PublishDuringCopy)

    def start_writing() -> None:
        weights._ctl["seq"][0] = 3
        flat[: numel // 2] = 2.0

    dest.writer = start_writing
    assert weights.read_into(dest) is None  # half old, half new: refused
    flat[numel // 2:] = 2.0
    weights._ctl["seq"][0] = 4
    dest.writer = lambda: weights.publish(np.full(numel, 3.0, dtype=np.float32), 3)  # a whole version lands
    assert weights.read_into(dest) is None  # the copy is version 3 but the read began on 2: refused too
    assert weights.read_into(dest) == 3 and (np.asarray(dest) == 3.0).all()
    os.close(weights.fd)


def test_weights_read_before_first_publication_returns_none() -> None:
    weights = SharedWeights()
    dest = np.zeros(4, dtype=np.float32)
    assert weights.read_into(dest) is None  # not allocated yet
    weights.allocate(4)
    assert weights.read_into(dest) is None and weights.version == 0  # allocated, nothing published
    weights.publish(np.arange(4, dtype=np.float32), 1)
    assert weights.read_into(dest) == 1
    np.testing.assert_array_equal(dest, np.arange(4))
    os.close(weights.fd)


def test_no_shared_memory_in_dev_shm(shm_guard: set[str]) -> None:
    """Buffers, weights and queues are anonymous: creating and using them names nothing in /dev/shm."""
    cfg = Config(env="null", workers=2, envs_per_worker=4)
    arrays = allocate_trajectories(cfg, NULL_SPEC)
    weights = SharedWeights()
    weights.allocate(1000)
    channels = Channels.create(cfg.workers, num_slots(cfg))
    channels.free.put_many(list(range(num_slots(cfg))))
    proc = fork(lambda: arrays["obs"].fill(1.0))
    join_ok(proc)
    assert (arrays["obs"] == 1.0).all()
    os.close(weights.fd)


# --- Config.validate --------------------------------------------------------------------------------------


# Explicit sampling sizes, so the expected messages do not depend on the automatic --envs-per-worker.
BASE = {"workers": 4, "envs_per_worker": 4, "worker_splits": 2, "rollout": 32, "batch_size": 1024, "minibatches": 4}


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"rollout": 1}, "--rollout must be at least 2"),
    ({"rollout": 0}, "--rollout must be at least 2"),
    ({"workers": 0}, "--workers must be at least 1"),
    ({"workers": -3}, "--workers must be at least 1"),
    ({"envs_per_worker": -2}, "--envs-per-worker must be at least 1"),
    ({"policy_workers": 0}, "--policy-workers must be at least 1"),
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"epochs": -1}, "--epochs must be at least 1"),
    ({"minibatches": 0}, "--minibatches must be at least 1"),
    ({"frames": -1}, "--frames must not be negative"),
    ({"seconds": -5.0}, "--seconds must not be negative"),
    ({"max_policy_lag": -1}, "--max-policy-lag must not be negative"),
    ({"lr": 0.0}, "--lr must be positive"),
    ({"gamma": 1.5}, "--gamma must be in [0, 1]"),
    ({"envs_per_worker": 3, "worker_splits": 2}, "does not divide into --worker-splits"),
    ({"envs_per_worker": 2, "worker_splits": 4}, "does not divide into --worker-splits"),
    ({"batch_size": 1000}, "try --batch-size 1024"),  # 32 steps x 2 envs = 64 samples per trajectory
    ({"batch_size": 10}, "try --batch-size 64"),
    ({"batch_size": 192, "minibatches": 4}, "--minibatches 4 must divide the 6 env columns of a batch (3 traj"),
    ({"device": "tpu"}, "--device must be auto, cpu or cuda"),
    ({"lr_schedule": "linear"}, "needs --frames"),
    ({"lr_schedule": "cosine"}, "--lr-schedule must be kl, constant, linear or auto"),
    ({"kl_target": 0.0}, "--kl-target must be positive"),
    ({"rollout_nice": 20}, "--rollout-nice must be in 0..19"),
    ({"policy_nice": -1}, "--policy-nice must be in 0..19"),
])
def test_validate_rejects_impossible_settings(overrides: dict, expected: str) -> None:
    cfg = Config(**{**BASE, **overrides})
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("overrides", [
    {},
    {"workers": 32, "envs_per_worker": 2, "batch_size": 1024},
    {"rollout": 2, "envs_per_worker": 1, "worker_splits": 1, "batch_size": 2, "minibatches": 1},
    {"batch_size": 256, "rollout": 16, "minibatches": 4, "epochs": 8},
    {"lr_schedule": "linear", "frames": 1000, "device": "cuda:1"},
])
def test_validate_accepts_consistent_settings(overrides: dict) -> None:
    cfg = Config(**{**BASE, **overrides})
    cfg.validate()
    assert cfg.trajectories_per_batch * cfg.rollout * cfg.envs_per_split == cfg.batch_size


@pytest.mark.parametrize(("workers", "batch_size", "rollout"), [(1, 1024, 32), (4, 1024, 32), (32, 1024, 32),
                                                                 (2, 256, 16), (64, 512, 64)])
def test_automatic_envs_per_worker_gives_a_valid_config(workers: int, batch_size: int, rollout: int) -> None:
    cfg = Config(workers=workers, batch_size=batch_size, rollout=rollout, minibatches=1, envs_per_worker=0).resolve()
    assert cfg.envs_per_worker >= cfg.worker_splits
    cfg.validate()
