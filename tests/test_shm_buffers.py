"""Shared memory between forked processes: SharedArrays (the trajectory slots) handed over through faster-fifo
queues, the SharedWeights seqlock (no torn copy is ever accepted), and nothing named in /dev/shm."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
from faster_fifo import Queue

from asyncrl import shm as shared
from asyncrl.config import Config
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.runtime.plumbing.channels import Channels
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots
from asyncrl.shm import SharedArrays, SharedWeights
from tests.forked import fork, join_ok

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
