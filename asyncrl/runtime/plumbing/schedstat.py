"""How long this thread has waited in the CPU run queue: runnable, but another task held the core.

Linux keeps it in `/proc/thread-self/schedstat` (on-CPU ns, run-queue wait ns, timeslices). A stage timer
cannot tell a process waiting for a core from one waiting for its peers, so the run-queue delay is reported
beside the stage times and the bottleneck verdict judges CPU starvation on its own. Torch-free.
"""

from __future__ import annotations

SCHEDSTAT = "/proc/thread-self/schedstat"


def run_queue_delay_s(path: str = SCHEDSTAT) -> float | None:
    """This thread's total run-queue delay in seconds, or None where the kernel does not report it."""
    try:
        with open(path, "rb") as f:
            fields = f.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
