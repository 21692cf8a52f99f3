"""Unsticks a faster-fifo queue that a killed process left locked.

faster-fifo guards each queue with a process-shared pthread mutex and two condition variables. Neither is
"robust": a process killed while it holds the mutex leaves it locked forever, and with glibc < 2.41 a process
killed while *waiting* on a condition variable leaves a group reference behind, so the next
`pthread_cond_signal` that has to switch groups waits for that reference forever, while holding the queue's
mutex; a waiter killed while it cancels a timed-out wait leaves the condition variable's internal lock taken,
with the same effect. Rollout workers spend most of their time waiting on a queue, so killing one (SIGKILL,
the OOM killer, the supervisor's own hang handling) would, sooner or later, freeze the whole run.

`QueueRepair.check()`, called about twice a second from a thread in the runner, looks at each queue's mutex
and condition variables. Each of these locks is held for microseconds, so one seen held in the same way at
`STUCK_CHECKS` consecutive checks is stuck: a mutex whose owner thread is dead is released; a condition
variable's internal lock is released; group references a signaler is waiting for are cleared (live waiters
drop theirs within their 0.1 s timeouts, so whatever is still there after a second belongs to the dead).
Every repair wakes the futex waiters. This depends on faster-fifo's `Queue` and glibc's `pthread_mutex_t`
and `pthread_cond_t` layouts; `QueueRepair.supported()` checks them on a scratch queue and the repair
switches itself off (with a reason) if they differ.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable, Sequence

from faster_fifo import Queue

# faster-fifo 1.5 `struct Queue`: 6 size_t, mutexattr, mutex, condattr, 2 ints, not_empty, not_full.
_QUEUE_SIZE = 208
_MUTEX, _CONDS = 56, (112, 160)
# glibc (x86_64 / aarch64) pthread_mutex_t: int __lock; unsigned __count; int __owner; ...
_LOCK, _OWNER = 0, 8
# glibc 2.25-2.40 pthread_cond_t: wseq (8), g1_start (8), unsigned __g_refs[2], __g_size[2], __g1_orig_size
# (whose low two bits are the condvar's internal lock), ...
_G_REFS, _ORIG_SIZE = 16, 32
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
STUCK_CHECKS = 3

_libc = ctypes.CDLL(None, use_errno=True)


def _glibc_version() -> tuple[int, int]:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else (0, 0)
    except (AttributeError, ValueError, OSError):
        return (0, 0)


def _futex_wake(address: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 2**31 - 1, None, None, 0)


def _thread_alive(tid: int) -> bool:
    """True while thread `tid` exists and is not a zombie (an unreaped dead child still has /proc)."""
    try:
        with open(f"/proc/{tid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class QueueRepair:
    """Watches faster-fifo queues for a lock that a dead process left behind, and releases it."""

    def __init__(self, queues: Sequence[tuple[str, Queue]], alive: Callable[[int], bool] = _thread_alive):
        self.queues = [(name, ctypes.addressof(q.queue_obj_buffer)) for name, q in queues]
        self.alive = alive
        self.fix_condvars = _glibc_version() < (2, 41)
        self._seen: dict[tuple, tuple[object, int]] = {}  # word -> (state, consecutive checks seen)
        self.repairs: list[str] = []

    @staticmethod
    def supported() -> str | None:
        """None if the layouts are the expected ones, else why the repair is off."""
        if _SYS_FUTEX is None or _glibc_version() == (0, 0):
            return f"queue repair needs glibc on x86_64 or aarch64 (this is {platform.machine()})"
        probe = Queue(max_size_bytes=1024)
        if len(probe.queue_obj_buffer) != _QUEUE_SIZE:
            return f"queue repair does not know this faster-fifo's layout ({len(probe.queue_obj_buffer)} bytes)"
        mutex = ctypes.addressof(probe.queue_obj_buffer) + _MUTEX
        if _libc.pthread_mutex_lock(ctypes.c_void_p(mutex)) != 0:
            return "queue repair could not lock a probe queue"
        lock = ctypes.c_int.from_address(mutex + _LOCK).value
        owner = ctypes.c_int.from_address(mutex + _OWNER).value
        _libc.pthread_mutex_unlock(ctypes.c_void_p(mutex))
        if lock != 1 or owner != threading.get_native_id():
            return "queue repair does not recognise this glibc's mutex layout"
        return None

    def _stuck(self, key: tuple, state: object) -> bool:
        """True once `state` (None: all clear) has been the same for STUCK_CHECKS checks in a row."""
        if state is None:
            self._seen.pop(key, None)
            return False
        previous, count = self._seen.get(key, (state, 0))
        count = count + 1 if previous == state else 1
        if count >= STUCK_CHECKS:
            self._seen.pop(key, None)
            return True
        self._seen[key] = (state, count)
        return False

    def check(self) -> list[str]:
        """One pass over the queues; returns a line per repair made."""
        done: list[str] = []
        for name, base in self.queues:
            lock = ctypes.c_int.from_address(base + _MUTEX + _LOCK)
            owner = ctypes.c_int.from_address(base + _MUTEX + _OWNER).value
            if self._stuck((name, "mutex"), owner if lock.value else None) and not (owner and self.alive(owner)):
                ctypes.c_int.from_address(base + _MUTEX + _OWNER).value = 0
                lock.value = 0
                _futex_wake(base + _MUTEX + _LOCK)
                done.append(f"queue {name}: released the lock held by dead thread {owner}")
            if not self.fix_condvars:
                continue
            for cond in _CONDS:
                internal = ctypes.c_uint.from_address(base + cond + _ORIG_SIZE)
                if self._stuck((name, cond), bool(internal.value & 3) or None):
                    internal.value &= ~3  # a waiter died inside the condvar's own short critical section
                    _futex_wake(base + cond + _ORIG_SIZE)
                    done.append(f"queue {name}: released a condition-variable lock held by a dead waiter")
                for g in (0, 1):
                    refs = ctypes.c_uint.from_address(base + cond + _G_REFS + 4 * g)
                    if self._stuck((name, cond, g), bool(refs.value & 1 and refs.value >> 1) or None):
                        refs.value = 0  # a signaler waits for group references that only a dead waiter holds
                        _futex_wake(base + cond + _G_REFS + 4 * g)
                        done.append(f"queue {name}: cleared a dead waiter's condition-variable reference")
        self.repairs.extend(done)
        return done


class RepairThread(threading.Thread):
    """Runs `QueueRepair.check` every `interval` seconds until `stop()`; repairs go to `on_repair`."""

    def __init__(self, repair: QueueRepair, on_repair: Callable[[str], None], interval: float = 0.5):
        super().__init__(name="asyncrl-queue-repair", daemon=True)
        self.repair, self.on_repair, self.interval = repair, on_repair, interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            for line in self.repair.check():
                self.on_repair(line)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=2)
