"""Ordering on the data path: what a rollout worker does before a slot leaves it, and when the learner updates
the observation normaliser."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import gather_batch
from asyncrl.config import Config
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.runtime.plumbing.channels import Channels
from asyncrl.runtime.plumbing.liveness import NO_OWNER
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots
from asyncrl.runtime.roles.rollout_worker import run_rollout_worker
from tests.conftest import serve_request

SCRIBBLE = 123.0  # what the "learner" writes into a slot it has been handed (the null env's obs are all 0)


def serve(channels: Channels, traj, seen: list[tuple[int, int]], deadline: float) -> tuple[int, int]:
    """Act as the policy worker for one request; return its (slot, t)."""
    try:
        seen.append(serve_request(channels, traj, deadline))
    except AssertionError as exc:
        raise AssertionError(f"{exc} (served {seen})") from None
    return seen[-1]


def test_a_full_slot_is_left_alone_by_the_rollout_worker() -> None:
    """The real worker: before `full.put(slot)` it must have copied the bootstrap obs and cleared want[slot]."""
    cfg = Config(env="null", workers=1, envs_per_worker=2, worker_splits=1, rollout=4, batch_size=8,
                 minibatches=1)
    cfg.validate()
    traj = allocate_trajectories(cfg, NULL_SPEC)
    channels = Channels.create(cfg.workers, num_slots(cfg))
    first, spare = 0, 1
    channels.free.put(first)  # the spare slot is handed out only after the full one has been scribbled on
    proc = mp.get_context("fork").Process(target=run_rollout_worker, args=(0, cfg, traj, channels), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 60
        seen: list[tuple[int, int]] = []
        for t in range(cfg.rollout):
            assert serve(channels, traj, seen, deadline) == (first, t)
        full = channels.full.get(timeout=30)
        assert full == first
        want_at_handover = int(channels.live["want"][full])
        traj["obs"][full] = SCRIBBLE  # the learner owns the slot now: it may copy, reuse or overwrite it
        channels.free.put(spare)
        slot, t = serve(channels, traj, seen, deadline)
        assert (slot, t) == (spare, 0)
        assert (traj["obs"][spare, 0] == 0.0).all(), "the next trajectory started from an obs read after handover"
        assert want_at_handover == NO_OWNER, "a re-sent request could still be served into the full slot"
    finally:
        channels.request_stop()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_normaliser_is_updated_after_training_on_its_batch() -> None:
    """Fresh on-policy data (lag 0, behaviour log-probs from the same weights): the first minibatch's ratio is 1."""
    torch.manual_seed(0)
    cfg = Config(env="CartPole-v1", normalize_obs=True, workers=1, worker_splits=1, rollout=8, envs_per_worker=4,
                 batch_size=32, epochs=1,
                 minibatches=1, max_policy_lag=10)
    cfg.validate()
    from asyncrl.envs.registry import make_env_spec

    spec = make_env_spec(cfg.env)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    t, b = cfg.rollout, 4
    obs = (torch.randn(t + 1, b, 4) * torch.tensor([3.0, 0.2, 5.0, 0.1]) + 2.0).float()
    with torch.no_grad():
        policy_out, _ = learner.model(obs.reshape(-1, 4))
        dist = learner.model.distribution(policy_out[: t * b])
        actions = dist.sample()
        behaviour_logp = dist.log_prob(actions).reshape(t, b)
    traj = allocate_trajectories(cfg, spec)
    slots = np.array([0])
    traj["obs"][0] = obs.numpy()
    traj["actions"][0] = actions.reshape(t, b).numpy()
    traj["logp"][0] = behaviour_logp.numpy()
    traj["versions"][0] = learner.version
    traj["valid"][0] = True  # the rollout worker marks every step it completed
    traj["final_step"][0] = -1
    batch = gather_batch(traj, slots, learner.version, torch.device("cpu"))
    stats = learner.train(batch, frames=0)
    assert stats["importance_ratio_mean"] == 1.0
    assert stats["kl"] == 0.0 and stats["clip_fraction"] == 0.0
    # ... and the statistics did move, for the next batch
    assert learner.model.obs_normalizer.mean.abs().sum() > 0
