"""--frames stops a run within a step of the budget: the rollout worker whose steps bring the session's total to the
runner's `step_budget` reports them at once, not at its next one-second report (asyncrl/runtime/plumbing/liveness.py).

The real policy worker and rollout worker are forked here from a hand-built wiring, as the runner forks them; the
learner's weights are published once and never change."""

from __future__ import annotations

import time
from queue import Empty

import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.envs.registry import make_env_spec
from asyncrl.resolve import config_from_flags
from asyncrl.runtime.plumbing.wiring import build_wiring
from asyncrl.runtime.roles.learner import WeightsPublisher
from tests.roles import fork_roles, stop_roles

ENVS = 4  # one split: each step of the worker is 4 agent steps
EVERY_S = 1.0  # the rollout worker's report interval (asyncrl/runtime/plumbing/interval_stats.py)


def first_rollout_report(budget: int) -> tuple[dict, float]:
    """The first report of a rollout worker run with `step_budget` = `budget` (0: none), and the seconds from the
    first action request to that report."""
    cfg = config_from_flags(env="CartPole-v1", workers=1, envs_per_worker=ENVS, worker_splits=1, rollout=8,
                            batch_size=32, device="cpu", train_dir="/tmp")
    spec = make_env_spec(cfg)
    wiring = build_wiring(cfg, spec)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    WeightsPublisher(learner.policy_module(), wiring.weights[0]).publish(1)
    wiring.channels.live["step_budget"][0] = budget
    children = fork_roles(wiring, ("policy-0", "rollout-0"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                kind, _, _, payload = wiring.channels.reports.get(timeout=1.0)
            except Empty:
                continue
            if kind == "rollout" and payload["env_steps"] > 0:
                return payload, payload["t_total"]
            full = wiring.channels.full
            try:  # keep slots circulating as the learner would
                wiring.channels.free.put(full.get(block=False))
            except Empty:
                pass
        pytest.fail("no rollout report with steps within 60 s")
    finally:
        stop_roles(wiring, children)


def test_the_step_that_reaches_the_budget_is_reported_at_once() -> None:
    payload, waited = first_rollout_report(budget=ENVS)  # reached by the worker's first step
    assert payload["env_steps"] >= ENVS
    assert waited < EVERY_S / 2, f"reported {waited:.2f} s after the budget's step, as at the usual interval"


def test_without_a_budget_the_worker_reports_each_second() -> None:
    _, waited = first_rollout_report(budget=0)
    assert waited >= EVERY_S


@pytest.mark.parametrize("drain", [True, False])
def test_a_frames_stop_trains_the_whole_batches_already_collected(drain: bool, tmp_path) -> None:
    """The learner process finds a whole batch on the full queue and the runner's stop command already waiting: at a
    --frames stop (`drain`) it trains on the batch before its final checkpoint; at any other stop it saves at once."""
    import numpy as np

    from asyncrl.runtime.store.checkpoint import load_latest_checkpoint

    # one learner thread: a learner forked from this test process (which may have run torch's OpenMP pool in
    # earlier tests; the runner never has) must not start a pool of its own
    cfg = config_from_flags(env="CartPole-v1", workers=1, envs_per_worker=ENVS, worker_splits=1, rollout=8,
                            batch_size=64, device="cpu", train_dir=str(tmp_path), experiment="drain",
                            learner_threads=1)
    spec = make_env_spec(cfg)
    wiring = build_wiring(cfg, spec)
    traj, channels = wiring.traj, wiring.channels
    slots = [channels.free.get(timeout=5) for _ in range(cfg.trajectories_per_batch)]
    for slot in slots:  # finished trajectories of a uniform policy at version 1
        traj["valid"][slot] = True
        traj["logp"][slot] = np.log(0.5)
        traj["versions"][slot] = 1
        traj["obs"][slot] = np.random.default_rng(slot).standard_normal(traj["obs"][slot].shape) * 0.1
    channels.full.put_many(slots)
    channels.request_stop()
    channels.learner_cmds.put(("stop", 16, {}, drain))
    children = fork_roles(wiring, ("learner",))
    try:
        children[0].join(120)
        assert children[0].exitcode == 0
        _, state = load_latest_checkpoint(cfg.run_dir)
    finally:
        stop_roles(wiring, children)
    assert state["learner"]["version"] == (2 if drain else 1)  # 1: the first weights, published untrained
