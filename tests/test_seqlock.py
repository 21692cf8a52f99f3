"""`SharedWeights.read_into`, case by case: every read that overlaps a write (or that sees a publication's stores
out of order) is refused, and the read after it, which overlaps nothing, returns the new version whole.

Each refused case is one that a single check of `read_into` exists for: the odd sequence, the sequence re-read
after the copy, the stamp re-read after the copy, the stamp's version against the sequence's, and the crc of
the copy. Writes are made to land at chosen points of a read: before it, during the copy (`Hooked` runs the
writer just before or just after `np.copyto` fills the destination), or as a weakly ordered CPU may show them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from asyncrl import shm as shared
from asyncrl.shm import SharedWeights

N = 1 << 12


class Hooked(np.ndarray):
    """A destination whose next `np.copyto` into it runs `before` first and `after` once the copy is done."""

    before: Callable[[], None] | None = None
    after: Callable[[], None] | None = None

    def __array_function__(self, func, types, args, kwargs):
        if func is not np.copyto:
            return super().__array_function__(func, types, args, kwargs)
        before, after, self.before, self.after = self.before, self.after, None, None
        if before is not None:
            before()
        result = super().__array_function__(func, types, args, kwargs)
        if after is not None:
            after()
        return result


@pytest.fixture
def weights() -> Iterator[SharedWeights]:
    w = SharedWeights()
    w.allocate(N)
    w.publish(np.full(N, 1.0, np.float32), 1)
    yield w
    os.close(w.fd)


def full(value: float) -> np.ndarray:
    return np.full(N, value, np.float32)


def stamp_of(data: np.ndarray, version: int) -> np.uint64:
    return np.uint64(version << 32 | shared._crc(data, version))


def dest() -> Hooked:
    return np.zeros(N, np.float32).view(Hooked)


def read_ok(w: SharedWeights, d: np.ndarray, version: int) -> None:
    """A read that overlaps no write returns the latest version, copied whole."""
    assert w.read_into(d) == version
    assert (np.asarray(d) == float(version)).all()


def test_a_read_without_overlap_returns_the_version_whole(weights: SharedWeights) -> None:
    d = dest()
    read_ok(weights, d, 1)
    weights.publish(full(2.0), 2)
    read_ok(weights, d, 2)
    read_ok(weights, d, 2)  # a repeated read of the same version is accepted too


def test_a_handle_forked_before_allocation_attaches_and_reads() -> None:
    """A policy worker forked before the learner sized the memfd maps it on its first read."""
    w = SharedWeights()
    child = copy.copy(w)  # what a process forked now holds: the descriptor and control block, no mapping
    try:
        assert child.read_into(np.zeros(N, np.float32)) is None  # nothing allocated yet
        w.allocate(N)
        w.publish(full(4.0), 4)
        read_ok(child, np.zeros(N, np.float32), 4)
    finally:
        os.close(w.fd)


def test_a_read_that_starts_during_a_write_is_refused(weights: SharedWeights) -> None:
    """The writer has set the odd sequence of version 2 but changed no data yet: the copy would be version 1's
    data whole and its stamp would still match, yet a read begun inside a write must not be accepted."""
    weights._ctl["seq"][0] = 3
    d = dest()
    assert weights.read_into(d) is None
    np.copyto(weights._flat, full(2.0))  # the rest of publish(full(2.0), 2)
    weights._ctl["stamp"][0] = stamp_of(weights._flat, 2)
    weights._ctl["seq"][0] = 4
    read_ok(weights, d, 2)


def test_a_write_that_begins_during_the_copy_is_refused(weights: SharedWeights) -> None:
    """The read started on version 1; the writer takes the sequence odd just before the copy (no data changed
    yet, so the copy and its crc are version 1's): only the sequence re-read after the copy tells."""
    d = dest()
    d.before = lambda: weights._ctl["seq"].__setitem__(0, 3)
    assert weights.read_into(d) is None
    weights.publish(full(2.0), 2)
    read_ok(weights, d, 2)


def test_a_half_written_copy_is_refused(weights: SharedWeights) -> None:
    """The writer starts version 2 during the copy and has written half the vector when it is copied."""
    d = dest()

    def start_writing() -> None:
        weights._ctl["seq"][0] = 3
        weights._flat[: N // 2] = 2.0

    d.before = start_writing
    assert weights.read_into(d) is None
    weights.publish(full(2.0), 2)
    read_ok(weights, d, 2)


def test_a_stamp_that_changes_during_the_copy_is_refused(weights: SharedWeights) -> None:
    """After the copy the sequence reads as it did before it, but the stamp is another publication's (what a
    weakly ordered CPU can show when a publication races the read): only the stamp re-read tells."""
    d = dest()
    new = full(2.0)
    d.after = lambda: weights._ctl["stamp"].__setitem__(0, stamp_of(new, 1))
    assert weights.read_into(d) is None
    weights.publish(full(2.0), 2)
    read_ok(weights, d, 2)


def test_a_stamp_of_another_version_is_refused(weights: SharedWeights) -> None:
    """Version 2's sequence is visible, but the data and the stamp are still version 1's (a matching crc)."""
    weights._ctl["seq"][0] = 4
    d = dest()
    assert weights.read_into(d) is None
    weights.publish(full(2.0), 2)
    read_ok(weights, d, 2)


def test_a_torn_copy_under_a_complete_sequence_and_stamp_is_refused(weights: SharedWeights) -> None:
    """Version 2's sequence and stamp are visible before half of its data: only the copy's crc tells."""
    new = full(2.0)
    weights._ctl["seq"][0] = 4
    weights._ctl["stamp"][0] = stamp_of(new, 2)
    weights._flat[: N // 2] = 2.0
    d = dest()
    assert weights.read_into(d) is None
    weights._flat[N // 2:] = 2.0  # the rest of version 2's stores become visible
    read_ok(weights, d, 2)
