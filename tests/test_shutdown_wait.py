"""The runner's shutdown waits for a learner that is still working on its last update (its final checkpoint),
and only for as long as its heartbeat shows work: real forked processes and a shared heartbeat."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

from asyncrl.runtime.roles.runner import join_while_beating

CTX = mp.get_context("fork")


def _beat_for(beat, seconds: float, then_hang: bool) -> None:
    view = np.frombuffer(beat, dtype=np.float64)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        view[0] = time.monotonic()
        time.sleep(0.05)
    if then_hang:
        time.sleep(60)


def _start(seconds: float, then_hang: bool):
    beat = CTX.RawArray("d", 1)
    proc = CTX.Process(target=_beat_for, args=(beat, seconds, then_hang), daemon=True)
    proc.start()
    return proc, np.frombuffer(beat, dtype=np.float64)


def test_a_learner_still_beating_past_the_deadline_is_waited_for() -> None:
    proc, beat = _start(1.5, then_hang=False)
    t0 = time.monotonic()
    assert join_while_beating(proc, beat, deadline=t0 + 0.3, hang_timeout=1.0)
    assert time.monotonic() - t0 >= 1.4 and proc.exitcode == 0


def test_a_learner_whose_heartbeat_stopped_is_given_up_after_the_hang_timeout() -> None:
    proc, beat = _start(0.5, then_hang=True)
    t0 = time.monotonic()
    try:
        assert not join_while_beating(proc, beat, deadline=t0 + 0.2, hang_timeout=0.8)
        took = time.monotonic() - t0
        assert 1.2 <= took < 3.0, took  # 0.5 s of beats, then 0.8 s of silence
    finally:
        proc.kill()
        proc.join()
