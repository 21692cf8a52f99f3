"""Shared buffers, the weights seqlock and the queues, across real forked processes; Config.validate."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable

import numpy as np
import pytest
from faster_fifo import Queue

from asyncrl.config import Config, ConfigError
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.runtime.channels import Channels, Empty, drain, get_or_stop
from asyncrl.runtime.shared import SharedArrays, SharedWeights
from asyncrl.runtime.trajectories import allocate_trajectories, num_slots

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


def test_trajectory_slots_follow_the_engine_protocol_across_processes() -> None:
    """A forked 'rollout worker' and the parent as 'policy worker' + 'learner', with the real message shapes."""
    cfg = Config(env="null", workers=1, envs_per_worker=2, worker_splits=1, rollout=4, batch_size=8,
                 minibatches=1)
    cfg.validate()
    traj = allocate_trajectories(cfg, NULL_SPEC)
    channels = Channels.create(cfg.workers, num_slots(cfg))
    channels.free.put_many(list(range(num_slots(cfg))))

    def rollout_worker() -> None:
        for _ in range(2):  # two trajectories
            slot = get_or_stop(channels.free, channels)
            assert slot is not None
            for t in range(cfg.rollout):
                traj["obs"][slot, t] = 100 * slot + t
                channels.requests.put((0, 0, slot, t))
                split = get_or_stop(channels.actions_ready[0], channels)
                assert split == 0
                np.testing.assert_array_equal(traj["actions"][slot, t], [t % 2, (t + 1) % 2])
                traj["rewards"][slot, t] = t
                traj["terminated"][slot, t] = t == cfg.rollout - 1
            traj["obs"][slot, cfg.rollout] = -1.0  # bootstrap observation
            channels.full.put(slot)

    proc = fork(rollout_worker)
    full: list[int] = []
    while len(full) < 2:
        try:
            worker, split, slot, t = channels.requests.get(timeout=0.05)
        except Empty:
            full.extend(take_all(channels.full))
            continue
        assert (worker, split) == (0, 0)
        assert (traj["obs"][slot, t] == 100 * slot + t).all(), "policy side sees a stale observation"
        traj["actions"][slot, t] = [t % 2, (t + 1) % 2]
        traj["logp"][slot, t] = -0.5
        traj["versions"][slot, t] = 7
        channels.actions_ready[worker].put(split)
    join_ok(proc)
    full.extend(take_all(channels.full))
    assert len(full) == 2 and len(set(full)) == 2
    for slot in full:
        np.testing.assert_array_equal(traj["rewards"][slot], np.arange(4, dtype=np.float32)[:, None].repeat(2, 1))
        np.testing.assert_array_equal(traj["terminated"][slot, :, 0], [False, False, False, True])
        assert (traj["obs"][slot, cfg.rollout] == -1.0).all()
        assert (traj["versions"][slot] == 7).all() and (traj["logp"][slot] == -0.5).all()
    assert drain(channels.free) == num_slots(cfg) - 2


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
    ({"batch_size": 192, "minibatches": 2}, "--minibatches 2 must divide the 3 trajectories"),
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
