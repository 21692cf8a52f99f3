"""Shared memory that never touches /dev/shm.

Every buffer is an anonymous `MAP_SHARED` mapping (or a memfd) created by the runner before it forks the
other processes, so children inherit it, and the kernel frees it when the last process holding it exits,
however that process ends. Nothing is named, so nothing can leak into /dev/shm.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Mapping

import numpy as np

_ALIGN = 64  # cache-line alignment for every array


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class SharedArrays(Mapping[str, np.ndarray]):
    """A dict of numpy arrays laid out in one anonymous shared mapping."""

    def __init__(self, layout: Mapping[str, tuple[tuple[int, ...], np.dtype]]):
        offsets: dict[str, int] = {}
        total = 0
        for name, (shape, dtype) in layout.items():
            offsets[name] = total
            total += _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        self.nbytes = max(total, _ALIGN)
        self._mmap = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        self._arrays = {
            name: np.ndarray(shape, dtype=dtype, buffer=self._mmap, offset=offsets[name])
            for name, (shape, dtype) in layout.items()
        }

    @staticmethod
    def estimate_bytes(layout: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> int:
        return sum(_aligned(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize) for s, d in layout.values())

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


class SharedWeights:
    """The learner's published parameters: a memfd sized by the learner once it has built its model.

    The runner creates the (empty) memfd before forking, so every child inherits the descriptor; the learner
    `allocate`s it, the policy workers `attach` to it. The memfd is close-on-exec: a program an env or a
    user callback `exec`s does not inherit the weights.

    Publication is a seqlock whose correctness does not depend on the CPU's memory ordering. Python cannot
    emit fences, and on ARM (unlike x86) stores may become visible to another core out of program order, and
    loads may be satisfied out of order: a reader could see the even `seq` of version v while some of v's
    weight stores are not yet visible, and accept a torn copy. So a copy is accepted on evidence from the
    data itself, not on ordering:

    - After copying the weights in, the writer stores one 64-bit word `stamp = version << 32 | crc`, where
      `crc = crc32(weights, seed=version)`. An aligned 8-byte store is single-copy atomic on x86-64 and
      AArch64, so a reader sees a whole stamp of some publication, never half of two.
    - A reader takes the stamp, copies the weights, and accepts the copy only if the crc32 of *its own copy*
      (seeded with the stamp's version) equals the stamp's crc, and `seq` and the stamp are unchanged. Whatever
      order the stores became visible in, an accepted copy is byte-for-byte the data that was checksummed for
      that version: a mix of two publications, or data paired with another version's stamp, fails the check
      (but for a crc32 collision, chance 2^-32 per torn copy, and a torn copy itself needs a read that races a
      write). The `seq` counter (odd while writing) only lets readers skip a copy that is sure to fail.

    The learner never waits for readers; the cost is one crc32 per publish and per read (4.3 ms for the 6.8 MB
    of a 1.7M-parameter model on this 2-core machine, against learner updates that take hundreds of ms).
    """

    def __init__(self) -> None:
        self.fd = os.memfd_create("asyncrl-weights", os.MFD_CLOEXEC)
        self._ctl = SharedArrays({"seq": ((1,), np.int64), "numel": ((1,), np.int64), "stamp": ((1,), np.uint64)})
        self._flat: np.ndarray | None = None
        self._map: mmap.mmap | None = None

    @property
    def seq(self) -> int:
        return int(self._ctl["seq"][0])

    @property
    def version(self) -> int:
        """Number of completed publications (the policy version); 0 before the first."""
        return self.seq // 2

    def allocate(self, numel: int) -> np.ndarray:
        os.ftruncate(self.fd, max(numel, 1) * 4)
        self._ctl["numel"][0] = numel
        return self._attach(numel)

    def attach(self) -> np.ndarray | None:
        """Map the weights once the learner has allocated them; None until then."""
        numel = int(self._ctl["numel"][0])
        return self._attach(numel) if numel else None

    def _attach(self, numel: int) -> np.ndarray:
        if self._flat is None:
            self._map = mmap.mmap(self.fd, max(numel, 1) * 4, flags=mmap.MAP_SHARED)
            self._flat = np.ndarray((numel,), dtype=np.float32, buffer=self._map)
        return self._flat

    def publish(self, source: np.ndarray, version: int) -> None:
        """Copy flat float32 weights in; afterwards `self.version == version`."""
        assert self._flat is not None, "allocate() first"
        assert 0 < version < 1 << 31, version
        self._ctl["seq"][0] = 2 * version - 1  # odd: writing
        np.copyto(self._flat, source)
        self._ctl["stamp"][0] = np.uint64(version << 32 | _crc(self._flat, version))
        self._ctl["seq"][0] = 2 * version

    def read_into(self, dest: np.ndarray) -> int | None:
        """Copy the latest complete weights into dest; return their version, or None on a torn read."""
        if self._flat is None and self.attach() is None:
            return None
        before = self.seq
        if before == 0 or before % 2:
            return None
        stamp = int(self._ctl["stamp"][0])
        np.copyto(dest, self._flat)
        version, crc = stamp >> 32, stamp & 0xFFFFFFFF
        if version != before // 2 or _crc(dest, version) != crc:
            return None
        return version if self.seq == before and int(self._ctl["stamp"][0]) == stamp else None


def _crc(data: np.ndarray, version: int) -> int:
    """crc32 of the weights, seeded with the version so that a stamp cannot vouch for another version's data."""
    return zlib.crc32(memoryview(data).cast("B"), version & 0xFFFFFFFF)
