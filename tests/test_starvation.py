"""Starved is not hung: real processes on one pinned core, judged by the runner's own supervisor."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import time

import pytest

from asyncrl.runtime.recovery.starvation import StarvationWatch, stale, starved, thread_run_queue_delays
from asyncrl.runtime.recovery.supervisor import STALL_FACTOR, RunError, Supervisor
from tests.roles import supervised_channels

LIMIT_S = 1.5  # --hang-timeout
BURN_S = 0.06  # CPU time between two beats of the starved process: several seconds at nice 19 beside 3 hogs
LOCK_HELD_S = LIMIT_S + 1.0  # how long the starved process holds the lock another one sleeps on, at least
FORK = mp.get_context("fork")

pytestmark = pytest.mark.skipif(not thread_run_queue_delays(os.getpid()),
                                reason="the kernel reports no run-queue delays (/proc/<pid>/task/<tid>/schedstat)")


def _pin(cpu: int, nice: int = 0) -> None:
    os.sched_setaffinity(0, {cpu})
    if nice:
        os.nice(nice)


def _hog(cpu: int) -> None:
    _pin(cpu)
    while True:
        pass


def _starved(cpu: int, beats, lock=None) -> None:
    """Policy worker 0's heartbeat: at once, then after every BURN_S of its own CPU time, at the lowest priority.
    With `lock`: holds it from before the first beat until its first turn on the core LOCK_HELD_S later (a starved
    process inside a queue's lock)."""
    if lock is not None:
        lock.acquire()
    beats[0] = time.monotonic()
    held_until = beats[0] + LOCK_HELD_S
    _pin(cpu, nice=19)
    while True:
        start = time.process_time()
        while time.process_time() - start < BURN_S:
            if lock is not None and time.monotonic() > held_until:
                lock.release()
                lock = None
        beats[0] = time.monotonic()


def _waits_for_lock(cpu: int, beats, lock) -> None:
    """Policy worker 2's heartbeat: once worker 0 holds the lock, then not while it sleeps on the lock (a futex, as
    the learner on a queue's mutex that a starved rollout worker holds), then every 0.05 s."""
    _pin(cpu)
    while not beats[0]:
        time.sleep(0.01)
    beats[2] = time.monotonic()
    with lock:
        pass
    while True:
        beats[2] = time.monotonic()
        time.sleep(0.05)


def _asleep(cpu: int, beats) -> None:
    """Policy worker 1's heartbeat: once, then blocked forever (hung)."""
    _pin(cpu)
    beats[1] = time.monotonic()
    signal.pause()


def test_the_supervisor_waits_for_a_starved_process_and_kills_a_blocked_one() -> None:
    """Starved (policy-0) and asleep on a lock that the starved one holds (policy-2) are waited for; asleep for good
    (policy-1) is killed on time."""
    cfg, channels = supervised_channels(policy_workers=3, hang_timeout=LIMIT_S)
    beats, lines = channels.live["beat_policy"], []
    cpu = min(os.sched_getaffinity(0))
    hogs = [FORK.Process(target=_hog, args=(cpu,), daemon=True) for _ in range(3)]
    lock = FORK.Lock()
    procs = {"policy-0": FORK.Process(target=_starved, args=(cpu, beats, lock), daemon=True),
             "policy-1": FORK.Process(target=_asleep, args=(cpu, beats), daemon=True),
             "policy-2": FORK.Process(target=_waits_for_lock, args=(cpu, beats, lock), daemon=True)}
    respawned: list[str] = []

    def respawn(name: str) -> None:  # the runner's part: a fresh process that has not started its loop yet
        respawned.append(name)
        procs[name] = FORK.Process(target=signal.pause, daemon=True)
        supervisor.spawned(name)
        procs[name].start()

    supervisor = Supervisor(cfg, channels, procs, respawn, out=lambda *a, **k: lines.append(a[0]))
    blocked = procs["policy-1"]
    for p in hogs:
        p.start()
    try:
        for name, proc in procs.items():
            # as the runner does (Runner._spawn): told first, so it cannot clear a beat the process has already
            # written (a fresh-clone run lost policy-1's only beat that way and gave it the start-up grace)
            supervisor.spawned(name)
            proc.start()
        oldest = locked = 0.0
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and (oldest < LIMIT_S + 1.5 or not respawned or locked <= LIMIT_S + 0.5
                                               or time.monotonic() - beats[2] > 0.5):
            supervisor.check()  # it looks at most every 0.25 s
            if beats[0]:
                oldest = max(oldest, time.monotonic() - beats[0])
            if beats[2]:
                locked = max(locked, time.monotonic() - beats[2])
            time.sleep(0.05)
        killed = [line for line in lines if "made no progress" in line]
        # the blocked one is named and killed on time; the starved one went past the limit without beating (the
        # age alone would call it hung), is noted as starved and left running; so is the one asleep on its lock
        assert [line.split(" made")[0].split()[-1] for line in killed] == ["policy-1"], lines
        assert respawned == ["policy-1"] and not blocked.is_alive() and procs["policy-0"].is_alive()
        assert oldest > LIMIT_S + 1.5, (oldest, lines)
        assert any("policy-0 has not reported" in line and "starved, not hung" in line for line in lines), lines
        assert locked > LIMIT_S + 0.5 and time.monotonic() - beats[2] < 1.0 and procs["policy-2"].is_alive(), locked
        assert any("policy-2 has not reported" in line and "asleep on a lock" in line for line in lines), lines
    finally:
        everyone = [*hogs, blocked, *procs.values()]
        for p in everyone:
            if p.pid:
                p.kill()
        for p in everyone:
            if p.pid:
                p.join(timeout=5)


def _wait_pinned(procs: list, cpu: int, niced: object) -> None:
    """Until each of `procs` runs on `cpu` alone and `niced` at nice 19 (a busy machine can take a while to fork)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            if all(os.sched_getaffinity(p.pid) == {cpu} for p in procs) and \
                    os.getpriority(os.PRIO_PROCESS, niced.pid) == 19:
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("the pinned processes did not start within 30 s")


def test_the_watch_counts_the_wait_a_starved_process_is_in() -> None:
    """Linux adds a wait to the run-queue delay only when the thread gets its next turn: at nice 19 beside eight
    busy loops on its core that is a second or more apart (longer on a busier machine), and until then the age of a
    heartbeat would read as a hang. The watch counts the wait the thread is in, so at every look all of the watched
    time but the few milliseconds it ran and one look's interval is waiting."""
    cpu = min(os.sched_getaffinity(0))
    spinner = FORK.Process(target=_starved, args=(cpu, FORK.RawArray("d", 1)), daemon=True)
    hogs = [FORK.Process(target=_hog, args=(cpu,), daemon=True) for _ in range(8)]  # turns over a second apart
    watch = StarvationWatch(quiet_after_s=0.0)
    try:
        for p in [*hogs, spinner]:
            p.start()
        _wait_pinned([*hogs, spinner], cpu, niced=spinner)
        t0 = time.monotonic()
        watch.waited_s(spinner.pid, beat=t0, age=0.0)
        uncounted = []
        while time.monotonic() - t0 < 3.0:
            time.sleep(0.1)
            watched = time.monotonic() - t0
            uncounted.append(round(watched - watch.waited_s(spinner.pid, beat=t0, age=watched), 3))
        assert max(uncounted) < 0.5, uncounted
    finally:
        for p in [*hogs, spinner]:
            if p.pid:
                p.kill()
                p.join(timeout=5)


def test_the_rule_excuses_waiting_up_to_a_bound() -> None:
    assert not stale(1.9, 0.0, 2.0) and stale(2.1, 0.0, 2.0)
    assert not stale(15.0, 14.0, 2.0) and stale(15.0, 12.0, 2.0)
    assert stale(20.5, 20.5, 2.0)  # 10 limits: stale whatever it waited
    assert thread_run_queue_delays(2**22 + 7) == {}  # no such process: nothing to read
    # starved (the note) is waiting most of the watched time, not a busy machine's delays at each wake-up: an idle
    # process beside the suite once waited under 0.5 s of 1.5 s and was noted as starved
    assert starved(1.1, 1.5) and not starved(0.45, 1.5) and not starved(0.0, 0.0)


def _alive_but_idle(beats) -> None:
    """Policy worker 0's heartbeat every 0.1 s from a process that does nothing else: alive, and the run does not
    move (as a data path that waits on itself would leave it)."""
    while True:
        beats[0] = time.monotonic()
        time.sleep(0.1)


def _append_first(lines: list[str], line: str, **_) -> None:
    lines.append(line)


def _watch_stall(supervisor: Supervisor, progress: int, seconds: float) -> float | None:
    """Check the run at a standstill (`progress` unchanged) for up to `seconds`: when it raised RunError, else None."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            supervisor.check(progress=progress)
        except RunError:
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def test_a_run_stalled_by_starvation_waits_and_a_stalled_run_stops() -> None:
    """The run-level stall (no env step, no update for STALL_FACTOR hang timeouts) also excuses the time its
    processes waited for a core: a run whose only process is starved beside three hogs goes on (noted once), a
    run whose process is alive and idle stops on time, and before the run's first move the startup grace holds."""
    stall_s = STALL_FACTOR * LIMIT_S
    cpu = min(os.sched_getaffinity(0))
    for starving in (True, False):
        cfg, channels = supervised_channels(policy_workers=1, hang_timeout=LIMIT_S)
        beats, lines = channels.live["beat_policy"], []
        target, args = (_starved, (cpu, beats)) if starving else (_alive_but_idle, (beats,))
        procs = {"policy-0": FORK.Process(target=target, args=args, daemon=True)}
        hogs = [FORK.Process(target=_hog, args=(cpu,), daemon=True) for _ in range(3 if starving else 0)]
        supervisor = Supervisor(cfg, channels, procs, lambda name: None, out=functools.partial(_append_first, lines))
        try:
            for p in [*hogs, *procs.values()]:
                p.start()
            supervisor.spawned("policy-0")
            if not starving:  # not moved yet: starting up, within the startup grace however long it stands
                assert _watch_stall(supervisor, 0, stall_s + 0.5) is None, lines
            supervisor.check(progress=0)
            time.sleep(0.3)
            supervisor.check(progress=1)  # the run moved once
            pid = procs["policy-0"].pid
            before = thread_run_queue_delays(pid)
            stopped = _watch_stall(supervisor, 1, 1.5 * stall_s)
            after = thread_run_queue_delays(pid)
            # what the idle one waited for a core: on a machine busy with other work, seconds at times
            waited = max((after[t] - before[t] for t in after.keys() & before.keys()), default=0.0)
            if starving:
                assert stopped is None, lines
                assert [line for line in lines if "starved, not stalled" in line], lines
            else:
                # stopped on time, later only by what it waited; a machine that kept it waiting says so
                assert stopped is not None and stall_s < stopped < stall_s + waited + 1.0, (stopped, waited, lines)
                assert waited >= 0.5 or not [line for line in lines if "starved" in line], (waited, lines)
        finally:
            for p in [*hogs, *procs.values()]:
                if p.pid:
                    p.kill()
                    p.join(timeout=5)
