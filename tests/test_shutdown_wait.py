"""The runner's shutdown waits for a learner that is still working on its last update (its final checkpoint),
and only for as long as its heartbeat shows work: real forked processes and a shared heartbeat."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

from asyncrl.runtime.plumbing.schedstat import run_queue_delay_s
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
    view = np.frombuffer(beat, dtype=np.float64)
    while not view[0]:  # a learner at shutdown has been beating all along: a busy machine can take a while to fork
        time.sleep(0.01)
    return proc, view


def test_a_learner_still_beating_past_the_deadline_is_waited_for() -> None:
    proc, beat = _start(1.5, then_hang=False)
    deadline = time.monotonic() + 0.3
    assert join_while_beating(proc, beat, deadline=deadline, hang_timeout=1.0)
    assert proc.exitcode == 0 and float(beat[0]) > deadline, float(beat[0]) - deadline  # beat past it, waited for


def test_a_learner_whose_heartbeat_stopped_is_given_up_after_the_hang_timeout() -> None:
    proc, beat = _start(0.5, then_hang=True)
    try:
        waited0 = run_queue_delay_s() or 0.0
        assert not join_while_beating(proc, beat, deadline=time.monotonic() + 0.2, hang_timeout=0.8)
        silent, waited = time.monotonic() - float(beat[0]), (run_queue_delay_s() or 0.0) - waited0
        # 0.5 s of beats, then given up once 0.8 s of silence is seen: at the next of its 0.5 s looks, later only by
        # what this thread waited for a core (seconds at times on a machine busy with other work)
        assert proc.is_alive() and 0.8 <= silent < 0.8 + 0.5 + 0.2 + waited, (silent, waited)
    finally:
        proc.kill()
        proc.join()
