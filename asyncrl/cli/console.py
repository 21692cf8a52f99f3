"""The console scripts' entry points (`asyncrl-train` etc.): run the tool's `main()`, then end the process at once.

Tearing down an interpreter that imported torch costs about half a second of CPU after the command is done (freeing
every module; measured on a 2-core machine: `python -c "import torch"` 1.73 s against 1.15 s when it ends with
`os._exit`), so every short command and every run paid it. `exit_now` skips that teardown and nothing else a normal
exit does for the program: the atexit handlers run, stdout and stderr are flushed, and while a thread that is not a
daemon still runs the process exits the normal way (which waits for it). asyncrl's commands close every file they
write before `main()` returns. `main(argv)` itself stays a plain function for callers in Python.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """Exit with `code` (None as 0) after the atexit handlers and a flush of stdout and stderr, skipping the
    interpreter's teardown; the normal `sys.exit` while a non-daemon thread is alive."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written to it anyway
            pass
    os._exit(code or 0)


def _entry(tool: str) -> Callable[[], NoReturn]:
    def run() -> NoReturn:
        exit_now(importlib.import_module(f"asyncrl.cli.{tool}").main())

    run.__name__ = run.__qualname__ = tool
    run.__doc__ = f"`asyncrl-{tool}`: `asyncrl.cli.{tool}.main()`, then `exit_now`."
    return run


train = _entry("train")
bench = _entry("bench")
diagnose = _entry("diagnose")
enjoy = _entry("enjoy")
plot = _entry("plot")
compare = _entry("compare")
sweep = _entry("sweep")
export = _entry("export")
tune = _entry("tune")
