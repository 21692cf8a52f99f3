"""Telling a process starved of CPU from a hung one.

A heartbeat older than `--hang-timeout` reads as a hang. On an overloaded machine a healthy process can go that
long without beating because it is runnable but never gets a core (the learner beside a heavy job, or at a
lower priority than the work around it). Linux counts that time per thread (`/proc/<pid>/task/<tid>/schedstat`,
the run-queue delay), so the supervisor does not count it against the process: a heartbeat is stale when its
age, less the longest run-queue wait of any of the process's threads since the beat went quiet, exceeds the
limit. A process asleep forever (a deadlock, a blocked call) waits in no run queue and is caught on time; one
spinning without beating still loses the time it ran. One exception: a process asleep on a futex (a lock another
process may hold, such as a queue's mutex taken by a starved rollout worker) is starved through that process, so
the supervisor may excuse it by the waits of the run's other processes (`waits_on_a_futex`).
`STARVED_MAX_FACTOR` bounds the excuse. Where the kernel does not report run-queue delays nothing is excused.
Torch-free.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

QUIET_AFTER_S = 1.0  # a heartbeat this old (at most 1/8 of the limit) starts the run-queue watch; earlier waits count
STARVED_MAX_FACTOR = 10.0  # a heartbeat older than this many limits is stale whatever the process waited
# Said to be starved (the note) only past this share of the watched time spent waiting: an idle process on a busy
# machine waits a little at each wake-up (up to a third of 1.5 s under the test suite's load), a starved one
# most of the time (three quarters beside three busy loops on its core). The waits are excused either way.
STARVED_SHARE = 0.5


@dataclass(frozen=True)
class ThreadSched:
    """One thread's scheduler counters: seconds on a core, seconds waiting in a run queue, and whether it is
    runnable (running or waiting for a core) now."""

    on_cpu_s: float
    waited_s: float
    runnable: bool


def thread_sched(pid: int) -> dict[int, ThreadSched]:
    """The scheduler counters of each thread of process `pid`; {} where Linux does not report them."""
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                on_cpu, waited = f.read().split()[:2]
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]  # the name before it may hold spaces and ")"
            threads[int(tid)] = ThreadSched(int(on_cpu) / 1e9, int(waited) / 1e9, state == b"R")
        except (OSError, IndexError, ValueError):
            continue
    return threads


def waits_on_a_futex(pid: int) -> bool:
    """Whether process `pid`'s main thread sleeps in a futex wait: on a lock or condition, perhaps one another
    process holds (a queue's process-shared mutex). False where Linux does not say (`/proc/<pid>/wchan`)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/wchan", "rb") as f:
            return b"futex" in f.read()
    except OSError:
        return False


def thread_run_queue_delays(pid: int) -> dict[int, float]:
    """Run-queue delay in seconds of each thread of process `pid`; {} where Linux does not report it."""
    return {tid: t.waited_s for tid, t in thread_sched(pid).items()}


@dataclass
class StarvationWatch:
    """The run-queue delays of one process's threads when its heartbeat went quiet (per heartbeat value).

    Linux adds a wait to a thread's run-queue delay only once the thread gets a core: a process at nice 19 beside
    busy loops shows nothing for seconds, then the whole wait at once. A thread seen runnable with the same
    counters at two looks has waited all the time between them, so that time counts before the kernel adds it.
    """

    quiet_after_s: float = QUIET_AFTER_S
    beat: float = -1.0
    pid: int = -1
    base: dict[int, float] = field(default_factory=dict)
    seen: dict[int, tuple[ThreadSched, float]] = field(default_factory=dict)  # counters, when first seen so

    def waited_s(self, pid: int, beat: float, age: float) -> float:
        """Seconds the process has waited for a core since its heartbeat `beat` (now `age` s old) went quiet: the
        longest wait of any of its threads, the wait it is in now included. 0 until the beat is `quiet_after_s`
        old."""
        if age < self.quiet_after_s:
            return 0.0
        now, threads = time.monotonic(), thread_sched(pid)
        if (beat, pid) != (self.beat, self.pid):
            self.beat, self.pid = beat, pid
            self.base = {tid: t.waited_s for tid, t in threads.items()}
            self.seen = {tid: (t, now) for tid, t in threads.items()}
            return 0.0
        longest = 0.0
        for tid, t in threads.items():
            if tid not in self.base:
                continue
            waited = t.waited_s - self.base[tid]
            before, since = self.seen.get(tid, (None, now))
            if t.runnable and t == before:  # runnable and not run since it was first seen so: waiting all along
                waited += now - since
            else:
                self.seen[tid] = (t, now)
            longest = max(longest, waited)
        return longest


def starved(waited: float, watched: float) -> bool:
    """Whether `waited` s of waiting for a core in `watched` s of watching is starvation, not a busy machine's
    ordinary delays."""
    return watched > 0 and waited >= STARVED_SHARE * watched


def stale(age: float, waited: float, limit: float) -> bool:
    """A heartbeat `age` s old, `waited` s of it spent waiting for a core, is past `limit`."""
    return age > STARVED_MAX_FACTOR * limit or age - waited > limit
