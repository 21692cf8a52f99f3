"""The learner's lag gate (asyncrl/runtime/plumbing/lag_gate.py) on a run's real shared blocks: which slots an
update trains first and when it must wait for a slot still being filled."""

from __future__ import annotations

import dataclasses
import time

import pytest

from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.plumbing import lag_gate
from asyncrl.runtime.plumbing.lag_gate import LagGate
from asyncrl.runtime.plumbing.liveness import NO_OWNER, allocate_liveness, release_slots
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, local_slots, num_slots


@pytest.fixture
def blocks():
    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=8, rollout=4, batch_size=16)  # 1 slot a batch
    traj = allocate_trajectories(cfg, make_env_spec(cfg))
    live = allocate_liveness(cfg.workers, cfg.policy_workers, num_slots(cfg))
    return cfg, traj, live


def begin(traj, live, slot: int, version: int) -> None:
    """A policy worker acted the slot's first step at `version`."""
    traj["versions"][slot, 0] = version
    live["acted"][slot] = 0


def test_an_update_waits_for_a_slot_it_would_make_too_stale_and_trains_the_oldest_first(blocks, monkeypatch) -> None:
    cfg, traj, live = blocks
    assert cfg.max_policy_lag == 4 and local_slots(cfg) >= 3
    gate = LagGate(cfg, traj, live)
    assert gate.active
    begin(traj, live, 0, 10)  # a starved worker's slot, begun at version 10
    begin(traj, live, 1, 13)
    begin(traj, live, 2, 14)  # handed over: slots 1 and 2 are held by the learner, slot 0 is still filling
    assert gate.ready(13, [1])  # to version 14: slot 0's first step 4 updates old, the cap
    assert not gate.ready(14, [2])  # to 15: 5 updates old, so the update waits
    assert gate.oldest_first([2, 0, 1]) == [0, 1, 2]  # once slot 0 comes in, it is trained first
    assert gate.ready(14, [0])
    gate.taken([0, 1])
    assert list(live["acted"][:3]) == [NO_OWNER, NO_OWNER, 0]
    assert gate.ready(20, [2])  # nothing else begun (and slot 2, left out, would wait: 7 updates old)
    assert not gate.ready(20, [])

    monkeypatch.setattr(lag_gate, "MAX_WAIT_S", 0.2)  # a hung worker's slot holds an update only so long
    begin(traj, live, 0, 10)
    assert not gate.ready(20, [2])
    time.sleep(0.25)
    assert gate.ready(20, [2])


@pytest.mark.parametrize("change", [{"max_policy_lag": 0}, {"deterministic": True}, {"num_policies": 2},
                                    {"algo": "sac"}])
def test_the_gate_is_off_where_staleness_is_asked_for_or_counted_otherwise(blocks, change) -> None:
    cfg, traj, live = blocks
    assert not LagGate(dataclasses.replace(cfg, **change), traj, live).active


def test_a_slot_lost_with_a_dead_worker_holds_no_update(blocks) -> None:
    """A worker that dies handing a begun slot over may lose it (a spare replaces it): the supervisor's release
    clears the slot's mark, so no update waits on a slot that will never come."""
    cfg, traj, live = blocks
    gate = LagGate(cfg, traj, live)
    begin(traj, live, 0, 10)
    live["transit"][1] = 0  # worker 1 died between clearing its ownership of slot 0 and queueing it
    held, maybe_lost = release_slots(live, 1)
    assert held == [] and maybe_lost
    assert gate.ready(20, [])
