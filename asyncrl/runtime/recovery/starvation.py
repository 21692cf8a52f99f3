"""Telling a process starved of CPU from a hung one.

A heartbeat older than `--hang-timeout` reads as a hang. On an overloaded machine a healthy process can go that
long without beating because it is runnable but never gets a core (the learner beside a heavy job, or at a
lower priority than the work around it). Linux counts that time per thread (`/proc/<pid>/task/<tid>/schedstat`,
the run-queue delay), so the supervisor does not count it against the process: a heartbeat is stale when its
age, less the longest run-queue wait of any of the process's threads since the beat went quiet, exceeds the
limit. A process asleep forever (a deadlock, a blocked call) waits in no run queue and is caught on time; one
spinning without beating still loses the time it ran. `STARVED_MAX_FACTOR` bounds the excuse. Where the kernel
does not report run-queue delays nothing is excused. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

QUIET_AFTER_S = 1.0  # a heartbeat this old (at most 1/8 of the limit) starts the run-queue watch; earlier waits count
STARVED_MAX_FACTOR = 10.0  # a heartbeat older than this many limits is stale whatever the process waited
# Said to be starved (the note) only past this share of the watched time spent waiting: an idle process on a busy
# machine waits a little at each wake-up (up to a third of 1.5 s under the test suite's load), a starved one
# most of the time (three quarters beside three busy loops on its core). The waits are excused either way.
STARVED_SHARE = 0.5


def thread_run_queue_delays(pid: int) -> dict[int, float]:
    """Run-queue delay in seconds of each thread of process `pid`; {} where Linux does not report it."""
    delays = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                delays[int(tid)] = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return delays


@dataclass
class StarvationWatch:
    """The run-queue delays of one process's threads when its heartbeat went quiet (per heartbeat value)."""

    quiet_after_s: float = QUIET_AFTER_S
    beat: float = -1.0
    pid: int = -1
    base: dict[int, float] = field(default_factory=dict)

    def waited_s(self, pid: int, beat: float, age: float) -> float:
        """Seconds the process has waited for a core since its heartbeat `beat` (now `age` s old) went quiet: the
        longest wait of any of its threads. 0 until the beat is `quiet_after_s` old."""
        if age < self.quiet_after_s:
            return 0.0
        if (beat, pid) != (self.beat, self.pid):
            self.beat, self.pid, self.base = beat, pid, thread_run_queue_delays(pid)
            return 0.0
        now = thread_run_queue_delays(pid)
        return max((now[t] - self.base[t] for t in now.keys() & self.base.keys()), default=0.0)


def starved(waited: float, watched: float) -> bool:
    """Whether `waited` s of waiting for a core in `watched` s of watching is starvation, not a busy machine's
    ordinary delays."""
    return watched > 0 and waited >= STARVED_SHARE * watched


def stale(age: float, waited: float, limit: float) -> bool:
    """A heartbeat `age` s old, `waited` s of it spent waiting for a core, is past `limit`."""
    return age > STARVED_MAX_FACTOR * limit or age - waited > limit
