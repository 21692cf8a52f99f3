"""A thread of a run that ends with an exception says so in one line of the run's own, never with Python's
`Exception in thread ...` traceback.

* `surfaced(thread)`: a thread whose exception its owner raises again in the calling thread, as TensorBoard's
  writer thread does at the next write (the runner turns that `OSError` into its one-line error and names the last
  good checkpoint). Its end prints nothing here: the run reports it once.
* `route_to(out)`: for as long as a run goes, every other thread's exception is one warning line through `out`
  (the run's console, `print`-like); it returns the function that ends this.

Outside both, a thread's exception goes to the hook that was there before (Python's traceback).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

_surfaced: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_routes: list[Callable[..., Any]] = []  # the runs' `out`, newest last
_fallback: Callable[[threading.ExceptHookArgs], Any] = threading.excepthook


def one_line(exc: BaseException | None) -> str:
    """`OSError: [Errno 28] No space left on device`: the exception's type and first line."""
    text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.thread in _surfaced:
        return
    if not _routes:
        _fallback(args)
        return
    name = args.thread.name if args.thread is not None else "a thread"
    _routes[-1](f"asyncrl: warning: thread {name} stopped: {one_line(args.exc_value)}", file=sys.stderr)


def _install() -> None:
    """Make `_hook` the process's threading.excepthook (again, where something replaced it since)."""
    global _fallback
    if threading.excepthook is not _hook:
        _fallback, threading.excepthook = threading.excepthook, _hook


def surfaced(thread: threading.Thread) -> None:
    """`thread`'s exception is raised again by its owner: print nothing when it ends with one."""
    _surfaced.add(thread)
    _install()


def route_to(out: Callable[..., Any]) -> Callable[[], None]:
    """Until the returned function is called, a thread's exception is one warning line through `out`."""
    _install()
    _routes.append(out)

    def stop() -> None:
        if out in _routes:
            _routes.remove(out)

    return stop
