"""Run a function in a forked child process, as the runner forks its workers, and check that it exited cleanly
(tests/test_shm_buffers.py, tests/test_worker_handshake.py, tests/test_weight_refresh.py)."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable

import pytest
from faster_fifo import Queue

from asyncrl.runtime.plumbing.channels import Empty

FORK = mp.get_context("fork")


def fork(target: Callable[..., None], *args: object) -> mp.process.BaseProcess:
    """Run target in a forked child; an exception there becomes a non-zero exit code."""

    def main() -> None:
        try:
            target(*args)
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)

    proc = FORK.Process(target=main, daemon=True)
    proc.start()
    return proc


def join_ok(proc: mp.process.BaseProcess, timeout: float = 20.0) -> None:
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("child process hung")
    assert proc.exitcode == 0, f"child failed with exit code {proc.exitcode} (its traceback is on stderr)"


def take_all(q: Queue) -> list:
    try:
        return q.get_many(block=False)
    except Empty:
        return []
