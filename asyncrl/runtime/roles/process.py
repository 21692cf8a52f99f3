"""What every child process does first: name itself, die with its parent, leave stop signals to the runner."""

from __future__ import annotations

import ctypes
import os
import signal

from asyncrl.runtime.host.signals import GROUP_STOP_SIGNALS

_PR_SET_PDEATHSIG = 1
PARENT_PID: int | None = None  # set by the runner before it forks (see `mark_parent`)


def _ignore(_signum, _frame) -> None:
    """A no-op handler rather than SIG_IGN: a program an env execs gets the default dispositions back."""


def ignore_group_signals() -> None:
    """Leave SIGINT, SIGTERM and SIGHUP to the runner, which stops the children in order (the learner saves first).

    Ctrl-C, `docker stop`, Slurm's `scancel` and systemd signal the whole process group; a child that exited
    on its own would take the learner's final checkpoint with it. Children leave when the runner sets the
    stop flag, and die with it (`PR_SET_PDEATHSIG`) if it goes first.
    """
    for sig in GROUP_STOP_SIGNALS:
        signal.signal(sig, _ignore)


def mark_parent() -> None:
    """Called in the runner before forking: lets a child tell whether the runner died before it was armed."""
    global PARENT_PID
    PARENT_PID = os.getpid()


def init_child(title: str, nice: int = 0) -> None:
    """Set the process title and make the process die with the runner, however the runner ends.

    `nice` lowers this process's CPU priority (samplers yield the cores to the learner when both want them).

    The death signal is SIGKILL, not a catchable one: a child stuck inside an env's C code or a blocking
    call would never run a Python handler, and anonymous shared memory needs no cleanup anyway.
    """
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - setproctitle is a declared dependency
        pass
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # pragma: no cover - not Linux
        pass
    if nice > 0:
        os.nice(nice)
    ignore_group_signals()
    parent = os.getppid()
    if parent == 1 or (PARENT_PID is not None and parent != PARENT_PID):  # the runner died before we armed
        os._exit(0)
