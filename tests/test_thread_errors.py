"""A thread that ends with an exception: one warning line through the run's console, or nothing for a thread whose
owner raises the error again (asyncrl/diagnostics/thread_errors.py)."""

from __future__ import annotations

import threading

import pytest

from asyncrl.diagnostics.thread_errors import route_to, surfaced


def fail_in_thread(register: bool = False) -> None:
    def body() -> None:
        raise OSError(28, "No space left on device")

    thread = threading.Thread(target=body, name="writer")
    if register:
        surfaced(thread)
    thread.start()
    thread.join()


def test_a_threads_exception_is_one_warning_line_while_routed() -> None:
    lines: list[str] = []
    stop = route_to(lambda text, **_: lines.append(text))
    try:
        fail_in_thread()
        fail_in_thread(register=True)  # surfaced: its owner reports it
    finally:
        stop()
    assert lines == ["asyncrl: warning: thread writer stopped: OSError: [Errno 28] No space left on device"]


def test_outside_a_run_only_a_surfaced_thread_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that is not surfaced gets the hook that was there before (Python's traceback)."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.thread.name))
    fail_in_thread(register=True)
    fail_in_thread()
    assert seen == ["writer"]
