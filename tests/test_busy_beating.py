"""A long, legitimate step (a cold compile) is neither a hang nor a stall: judged by the runner's own supervisor on
a real process that beats from a thread while its main thread is busy, then blocks."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time

from asyncrl.runtime.plumbing.liveness import busy_beating
from asyncrl.runtime.recovery.supervisor import Supervisor
from tests.roles import supervised_channels

LIMIT_S = 0.5  # --hang-timeout: a process silent for 0.5 s is hung, a run still for 1 s stalled
BUSY_S = 3.0  # the step outlasts both several times over
FORK = mp.get_context("fork")


def _busy_then_blocked(live) -> None:
    """Beats once (its loop started), then a long step under `busy_beating` (its main thread never beats), then
    blocks for good: hung from then on."""
    live["beat_policy"][0] = time.monotonic()
    with busy_beating(live, "beat_policy", 0, every_s=0.1):
        end = time.monotonic() + BUSY_S
        while time.monotonic() < end:  # the main thread busy, as in a compile
            sum(range(10_000))
    signal.pause()


def test_a_busy_process_is_alive_and_the_run_moving_until_it_stops_beating() -> None:
    cfg, channels = supervised_channels(policy_workers=1, hang_timeout=LIMIT_S)
    live, lines, respawned = channels.live, [], []
    procs = {"policy-0": FORK.Process(target=_busy_then_blocked, args=(live,), daemon=True)}
    supervisor = Supervisor(cfg, channels, procs, respawned.append, out=lambda *a, **k: lines.append(a[0]))
    supervisor.spawned("policy-0")
    procs["policy-0"].start()
    try:
        supervisor.check(progress=(0, 0, 0))
        time.sleep(0.3)
        t0 = time.monotonic()
        while time.monotonic() - t0 < BUSY_S - 0.5:  # no env step, no update: only the busy counter moves
            supervisor.check(progress=(1, 1, int(live["busy"][0])))
            time.sleep(0.05)
        assert not respawned and procs["policy-0"].is_alive(), lines
        assert int(live["busy"][0]) >= 10, int(live["busy"][0])
        # once it blocks: named and killed as hung within the limit
        deadline = time.monotonic() + 10 * LIMIT_S
        while time.monotonic() < deadline and not respawned:
            supervisor.check(progress=(1, 1, int(live["busy"][0])))
            time.sleep(0.05)
        assert respawned == ["policy-0"] and not procs["policy-0"].is_alive(), lines
        assert any(line.startswith("asyncrl: policy-0 made no progress") for line in lines), lines
        assert BUSY_S - 0.5 < time.monotonic() - t0 < BUSY_S + 4 * LIMIT_S + 1.0, lines
    finally:
        proc = procs["policy-0"]
        if proc.pid:
            proc.kill()
            proc.join(timeout=5)
