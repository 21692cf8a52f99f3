"""Slot accounting through `build_wiring` and the real `Supervisor`: the run starts with exactly the circulating
slots on `free` and the spares held back, and a rollout worker that dies while handing a full slot over (its
ownership cleared, the slot not yet on `full`) is replaced with the slot it still held and one spare, so the
same number of slots circulates afterwards."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable

import pytest

from asyncrl.config import Config
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.runtime.plumbing.channels import Empty
from asyncrl.runtime.plumbing.liveness import NO_OWNER, NO_TRANSIT, TAKING
from asyncrl.runtime.plumbing.trajectories import SPARE_SLOTS, circulating_slots, num_slots
from asyncrl.runtime.plumbing.wiring import RunWiring, build_wiring
from asyncrl.runtime.recovery.supervisor import Supervisor

FORK = mp.get_context("fork")


def config(**overrides: object) -> Config:
    settings = {"env": "null", "workers": 2, "envs_per_worker": 4, "worker_splits": 2, "rollout": 5,
                "batch_size": 40, "minibatches": 1, **overrides}
    cfg = Config(**settings)
    cfg.validate()
    return cfg


def take_all(wiring: RunWiring) -> list[int]:
    try:
        return list(wiring.channels.free.get_many(block=False, max_messages_to_get=1000))
    except Empty:
        return []


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_run_starts_with_the_circulating_slots_free_and_the_spares_held_back(deterministic: bool) -> None:
    cfg = config(deterministic=deterministic, **({"workers": 1, "worker_splits": 1} if deterministic else {}))
    wiring = build_wiring(cfg, NULL_SPEC)
    try:
        allocated = wiring.traj["valid"].shape[0]
        circulating = circulating_slots(cfg)
        assert allocated == num_slots(cfg) == circulating + SPARE_SLOTS
        free = take_all(wiring)
        # Lockstep: one batch of slots, so the worker waits for each update; otherwise one per split plus a batch.
        expected = cfg.trajectories_per_batch if deterministic else cfg.num_splits + cfg.trajectories_per_batch
        assert sorted(free) == list(range(expected))
        supervisor = Supervisor(cfg, wiring.channels, {}, lambda name: None, out=lambda *a, **k: None)
        assert sorted(supervisor.spare_slots) == list(range(circulating, allocated))
    finally:
        wiring.close()


def die_handing_over(wiring: RunWiring, cleared: bool) -> None:
    """Rollout worker 0 in its own order: take two slots (one per split), fill the first, and get killed while
    handing it over: after `transit[0] = slot`, and (`cleared`) after clearing its ownership too."""
    live, free = wiring.channels.live, wiring.channels.free
    taken = []
    for _ in range(2):
        live["transit"][0] = TAKING
        slot = free.get(timeout=5)
        live["slot_owner"][slot], live["transit"][0] = 0, NO_TRANSIT
        taken.append(slot)
    live["transit"][0] = taken[0]  # handing over: ownership cleared, not yet queued
    if cleared:
        live["slot_owner"][taken[0]] = live["want"][taken[0]] = NO_OWNER
    os.kill(os.getpid(), signal.SIGKILL)  # before channels.full.put(slot)


def supervise_one_death(wiring: RunWiring, cfg: Config, body: Callable[[], None]) -> tuple[Supervisor, list[str]]:
    lines: list[str] = []
    procs: dict[str, mp.process.BaseProcess] = {}
    supervisor = Supervisor(cfg, wiring.channels, procs, lambda name: None, out=lambda *a, **k: lines.append(a[0]))
    procs["rollout-0"] = FORK.Process(target=body, daemon=True)
    procs["rollout-0"].start()
    supervisor.spawned("rollout-0")
    procs["rollout-0"].join(10)
    assert procs["rollout-0"].exitcode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while supervisor.worker_restarts == 0 and time.monotonic() < deadline:
        supervisor.check()  # it looks at most every 0.25 s
        time.sleep(0.05)
    assert supervisor.worker_restarts == 1, lines
    assert wiring.channels.live["transit"][0] == NO_TRANSIT
    return supervisor, lines


@pytest.mark.parametrize("cleared", [True, False], ids=["ownership-cleared", "still-owned"])
def test_a_slot_lost_in_transit_is_replaced_by_a_spare(cleared: bool) -> None:
    """Cleared: the slot the worker was handing over is on no queue and owned by nobody, so it is lost; the
    supervisor hands back the slot the worker still held and puts a spare in circulation. Still owned: the
    slot is released with the other, and no spare is spent."""
    cfg = config()
    wiring = build_wiring(cfg, NULL_SPEC)
    try:
        circulating = circulating_slots(cfg)
        supervisor, lines = supervise_one_death(wiring, cfg, lambda: die_handing_over(wiring, cleared))
        free = take_all(wiring)
        owned = [s for s, w in enumerate(wiring.channels.live["slot_owner"]) if w != NO_OWNER]
        assert owned == [] and len(set(free)) == len(free)
        assert len(free) == circulating, (free, lines)  # as many slots circulate as before the death
        spares = list(range(circulating, num_slots(cfg)))
        if cleared:
            lost = 0  # the first slot the worker took off `free` (ids are queued in order)
            assert sorted(free) == sorted(set(range(circulating)) - {lost} | {spares[-1]})
            assert supervisor.spare_slots == spares[:-1]
            assert "a spare slot stands in for it" in lines[-1], lines
        else:
            assert sorted(free) == list(range(circulating))
            assert supervisor.spare_slots == spares
            assert "spare" not in lines[-1], lines
    finally:
        wiring.close()
