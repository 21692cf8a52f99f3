"""What every child process does first: name itself, die with its parent, leave Ctrl-C to the runner."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def init_child(title: str) -> None:
    """Set the process title and make the process exit when the runner dies, even by SIGKILL."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - setproctitle is a declared dependency
        pass
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # pragma: no cover - not Linux
        pass
    # Ctrl-C reaches the whole process group; only the runner reacts, and stops the others in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if os.getppid() == 1:  # the runner died before the death signal was armed
        os._exit(0)
