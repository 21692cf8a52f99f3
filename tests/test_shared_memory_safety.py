"""SharedWeights on weakly ordered CPUs, and close-on-exec shared-memory descriptors."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

from asyncrl.shm import SharedWeights


@pytest.fixture
def weights():
    w = SharedWeights()
    yield w
    os.close(w.fd)


def _visible(w: SharedWeights, seq: int, data: np.ndarray, stamp: int | None = None) -> None:
    """Make memory look the way a reader on another core may see it when stores become visible out of order."""
    w._ctl["seq"][0] = seq
    np.copyto(w._flat, data)
    if stamp is not None:
        w._ctl["stamp"][0] = stamp


def test_a_publication_seen_out_of_order_is_never_accepted(weights: SharedWeights) -> None:
    """On ARM a reader may see version 2's even `seq` (and even its stamp) before all of its weight stores:
    the copy must be refused, whichever of the stores are visible."""
    n = 4096
    weights.allocate(n)
    weights.publish(np.full(n, 1.0, np.float32), 1)
    dest = np.empty(n, np.float32)
    assert weights.read_into(dest) == 1 and (dest == 1).all()

    new = np.full(n, 2.0, np.float32)
    half_new = np.where(np.arange(n) < n // 2, 2.0, 1.0).astype(np.float32)
    _visible(weights, 4, half_new)  # seq of v2 visible, half the data, old stamp
    assert weights.read_into(dest) is None
    _visible(weights, 4, new)  # seq and all data visible, stamp not yet
    assert weights.read_into(dest) is None
    old_stamp = int(weights._ctl["stamp"][0])
    weights.publish(new, 2)
    new_stamp = int(weights._ctl["stamp"][0])
    _visible(weights, 4, half_new, new_stamp)  # seq and stamp of v2 visible before half of its data
    assert weights.read_into(dest) is None
    _visible(weights, 4, np.full(n, 1.0, np.float32), old_stamp)  # v1's data and stamp under v2's seq
    assert weights.read_into(dest) is None
    _visible(weights, 4, new, new_stamp)  # everything visible: accepted
    assert weights.read_into(dest) == 2 and (dest == 2).all()


def test_weights_memfd_is_close_on_exec(weights: SharedWeights) -> None:
    assert fcntl.fcntl(weights.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
