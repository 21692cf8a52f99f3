"""`asyncrl-train ARGS` as a fork of the calling process: what `asyncrl-tune` (one short run per layout) and
`asyncrl-sweep` (one run per setting and seed) start. Torch and asyncrl are imported once in the caller
(`warm_up`), not again in a fresh interpreter for every run (2-3 s of CPU each). The part of subprocess.Popen
the callers use: poll, wait, send_signal, returncode. Torch-free until `warm_up`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


class ForkedRun:
    """`entry(args)` (asyncrl-train's command-line entry) in a forked child, its stdout and stderr on `out_fd`.

    `new_session`: the child leads a session of its own, so the caller can stop it with everything it started
    (`os.killpg`) and a terminal's Ctrl-C does not reach it; without it the child stays in the caller's process
    group, as a Popen child does, and a terminal's Ctrl-C reaches both.
    """

    def __init__(self, entry: Callable[[list[str]], int], args: list[str], out_fd: int,
                 new_session: bool = True) -> None:
        warm_up()
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                if new_session:
                    os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out_fd, 1)
                os.dup2(out_fd, 2)
                # the caller's sys.stdout/stderr may not write to fds 1 and 2 (a notebook's, pytest's capture)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's for its life
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                signal.signal(signal.SIGINT, signal.default_int_handler)  # the caller's own handler is not ours
                code = entry(args)
            except BaseException:  # noqa: BLE001 - the child reports and exits; it must not return into the caller
                import traceback

                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code or 0)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("asyncrl-train", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


def warm_up() -> None:
    """Import what every run imports (torch included) once, in the caller, before the first fork."""
    import torch  # noqa: F401

    import asyncrl.launch  # noqa: F401
    import asyncrl.runtime.roles.runner  # noqa: F401
