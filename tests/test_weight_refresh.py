"""The processes that read the learner's published weights act with the newest ones: each of two policy workers
(`--policy-workers 2`) and the evaluator (`--eval-every`) pick up a new version and act with it.

The real process bodies (`run_policy_worker`, `run_evaluator`) run forked on real shared weights, slots and
queues; the test plays the learner (it publishes an SAC actor whose action is a constant it chooses) and the
rollout workers or the runner (it asks for actions, or for an evaluation).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.off_policy.learner import OffPolicyActor
from asyncrl.agents.registry import learner_class
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.plumbing.channels import Channels, Empty
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots
from asyncrl.runtime.roles.learner import WeightsPublisher
from asyncrl.runtime.stages.evaluation import SEED_OFFSET
from asyncrl.shm import SharedArrays, SharedWeights
from tests.forked import fork, join_ok

SPEC = make_env_spec("Pendulum-v1")
# Each wait ends as soon as the answer is there; the bound is for a loaded machine, where the evaluator (at
# nice 19) took 13 s for three evaluations that take 0.7 s on idle cores.
WAIT_S = 120.0


class Learner:
    """Publishes the SAC actor the workers build, set to act `center + half_range tanh(bias)` on any
    observation (warm-up over, a near-zero spread), so an action says which publication produced it."""

    def __init__(self, cfg: Config, weights: SharedWeights):
        self.actor: OffPolicyActor = learner_class(cfg.algo).build_policy(SPEC, cfg, torch.device("cpu"))
        self.publisher = WeightsPublisher(self.actor, weights)
        with torch.no_grad():
            self.actor.warmup.fill_(0.0)
            for layer in (self.actor.net.mean, self.actor.net.log_std):
                layer.weight.zero_()
            self.actor.net.log_std.bias.fill_(-20.0)

    def publish(self, bias: float, version: int) -> float:
        """Publish `version`; return the action it takes."""
        with torch.no_grad():
            self.actor.net.mean.bias.fill_(bias)
            action = float(self.actor.net.greedy(torch.zeros(1, 3))[0, 0])
        self.publisher.publish(version)
        return action


def policy_worker_body(*args: object) -> None:
    from asyncrl.runtime.roles.policy_worker import run_policy_worker

    run_policy_worker(*args)


def evaluator_body(*args: object) -> None:
    from asyncrl.runtime.roles.evaluator import run_evaluator

    run_evaluator(*args)


def test_each_of_two_policy_workers_acts_with_the_newest_weights() -> None:
    """Each worker gets its own request queue here, so that both are sure to serve a request after each
    publication (on one shared queue, either may take them all)."""
    cfg = Config(env="Pendulum-v1", algo="sac", workers=1, envs_per_worker=2, worker_splits=1, rollout=4,
                 batch_size=8, minibatches=1, policy_workers=2, hidden_size=16, policy_nice=0, learning_starts=0)
    cfg.validate()
    traj, weights = allocate_trajectories(cfg, SPEC), SharedWeights()
    learner = Learner(cfg, weights)
    first = learner.publish(1.0, 1)
    per_worker = [Channels.create(cfg.workers, num_slots(cfg), cfg.policy_workers) for _ in range(2)]
    procs = [fork(policy_worker_body, i, cfg, SPEC, traj, weights, per_worker[i]) for i in range(2)]
    try:
        second = None
        for t, version in enumerate((1, 2, 2)):
            if t == 1:
                second = learner.publish(-1.0, 2)
            for i, channels in enumerate(per_worker):
                slot = i  # worker i's requests are for slot i
                traj["obs"][slot, t] = np.random.default_rng(t).standard_normal((cfg.envs_per_split, 3))
                channels.live["want"][slot] = t
                channels.requests.put((0, 0, slot, t))
                assert channels.actions_ready[0].get(timeout=WAIT_S) == 0
                assert channels.live["acted"][slot] == t
                expected = first if version == 1 else second
                assert traj["versions"][slot, t] == version, (i, t, traj["versions"][slot])
                np.testing.assert_allclose(traj["actions"][slot, t], expected, atol=1e-5, err_msg=f"worker {i}")
        assert abs(first - second) > 1.0
    finally:
        for channels in per_worker:
            channels.request_stop()
        for proc in procs:
            join_ok(proc)
    os.close(weights.fd)


def constant_action_return(action: float, seed: int) -> float:
    """Pendulum's return for one episode from reset(seed) under a constant action."""
    env = gym.make("Pendulum-v1")
    env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(np.array([action], np.float32))
        total += float(reward)
        done = terminated or truncated
    env.close()
    return total


def test_the_evaluator_scores_the_newest_weights(tmp_path: Path) -> None:
    cfg = Config(env="Pendulum-v1", algo="sac", hidden_size=16, eval_every=1000, eval_episodes=1,
                 train_dir=str(tmp_path), experiment="e")
    weights, channels = SharedWeights(), Channels.create(1, 4)
    request = SharedArrays({"due": ((2,), np.dtype(np.int64))})  # runtime/plumbing/eval_schedule.py's request block
    learner = Learner(cfg, weights)
    proc = fork(evaluator_body, cfg, SPEC, weights, channels, request)

    def evaluate(frames: int) -> dict:
        request["due"][0] = frames
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                kind, _, _, payload = channels.reports.get(timeout=1.0)
            except Empty:
                assert proc.is_alive(), "the evaluator died"
                continue
            if kind == "eval":
                return payload
        pytest.fail("no evaluation came back")

    try:
        results = []
        for version, bias, frames in ((1, 1.0, 1000), (4, -1.0, 2000)):
            action = learner.publish(bias, version)
            result = evaluate(frames)
            assert result["eval_frames"] == frames and result["eval_policy_version"] == version, result
            expected = constant_action_return(action, cfg.seed + SEED_OFFSET)  # env 0 of the greedy episodes
            assert result["eval_return_mean"] == pytest.approx(expected, rel=1e-4), (version, result)
            results.append(result["eval_return_mean"])
        assert abs(results[0] - results[1]) > 1.0, results
    finally:
        channels.request_stop()
        join_ok(proc)
    os.close(weights.fd)
