"""Off-policy learners (--algo sac, td3, redq): replay insertion, the UTD rule, time-limit bootstrapping, what is
published, warm-up, and end-to-end runs through the real processes."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from asyncrl.agents import registry
from asyncrl.agents.base import Learner
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.models.actor_critic import flat_state
from tests import launcher
from tests.conftest import start_train
from tests.off_policy_batches import SPEC, B, T, make_batch, make_learner

ALGOS = ("sac", "td3", "redq")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread here, as in the learner process on a loaded machine: the in-process learners' small updates
    ran 3.4x the CPU on two threads (OpenMP's threads spin waiting for a core: 13.4 s of CPU for this file's
    in-process tests, 3.9 s on one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("algo", ALGOS)
def test_only_valid_transitions_are_sampleable(algo: str) -> None:
    learner = make_learner(algo, utd=0.0 + 1e-9)
    batch = make_batch()
    batch.valid[1, 2] = False  # the env raised in step 1 of env 2
    batch.truncated[2, 0] = True  # a second cut of env 0 in the slot: no final observation kept for it
    assert learner.insert(batch) == T * B - 2
    buf = learner.buffer
    seg, step = divmod(np.flatnonzero(~buf.sampleable.ravel()[: T * B]), T)
    assert sorted(zip(seg.tolist(), step.tolist())) == [(0, 2), (2, 1)]  # segment = env column, step = t
    drawn = buf.sample_indices(2000, np.random.default_rng(0))
    assert not np.isin(drawn, [0 * T + 2, 2 * T + 1]).any()


@pytest.mark.parametrize("algo", ALGOS)
def test_updates_follow_the_utd_ratio_with_the_remainder_carried(algo: str) -> None:
    learner = make_learner(algo, utd=0.3)
    beats = []
    learner.heartbeat = lambda: beats.append(1)  # the learner process's liveness beat, once per update
    counts = [learner.train(make_batch(i), 0)["updates"] for i in range(5)]
    assert counts == [4, 3, 4, 3, 4]  # 3.6 per batch of 12 steps: 4 (-0.4), 3 (+0.2), 4 (-0.2), 3 (+0.4), 4 (0.0)
    assert learner.updates == round(0.3 * 5 * T * B) == len(beats)
    stats = learner.train(make_batch(9), 0)
    assert math.isclose(stats["utd_achieved"], learner.updates / (6 * T * B))
    assert all(math.isfinite(stats[k]) for k in ("critic_loss", "actor_loss", "q_update_mean", "alpha"))


def test_no_updates_and_random_actions_until_learning_starts() -> None:
    learner = make_learner("sac", learning_starts=2 * T * B, utd=1.0)
    actor = learner.policy_module()
    assert float(actor.warmup) == 1.0
    acts, _ = actor.act(torch.zeros(5000, 3))
    assert acts.min() >= -2 and acts.max() <= 2 and acts.min() < -1.9 and acts.max() > 1.9  # uniform over [-2, 2]
    assert learner.train(make_batch(0), 0)["updates"] == 0
    assert float(actor.warmup) == 1.0
    stats = learner.train(make_batch(1), 0)  # the buffer now holds learning_starts: the actor acts from here on
    assert float(actor.warmup) == 0.0 and stats["updates"] == 0  # no step of this batch is past the warm-up
    assert learner.train(make_batch(2), 0)["updates"] == T * B
    with torch.no_grad():  # a near-deterministic policy: the actions are its own, not uniform draws
        actor.net.log_std.weight.zero_()
        actor.net.log_std.bias.fill_(-10.0)
    acts, _ = actor.act(torch.zeros(5000, 3))
    assert acts.min() >= -2 and acts.max() <= 2 and acts.std() < 1e-3


@pytest.mark.parametrize("algo", ALGOS)
def test_a_truncated_transition_bootstraps_from_its_final_observation(algo: str) -> None:
    learner = make_learner(algo, utd=1e-9)
    batch = make_batch()
    batch.truncated[1, 2] = True
    batch.final_step[2] = 1
    batch.final_obs[2] = torch.tensor([7.0, 8.0, 9.0])
    batch.terminated[3, 0] = True
    learner.insert(batch)
    gathered = learner.buffer.gather(np.array([2 * T + 1, 0 * T + 3]))  # (env 2, step 1) and (env 0, step 3)
    assert np.array_equal(gathered.next_obs[0], [7.0, 8.0, 9.0]) and not gathered.terminated[0]
    assert gathered.terminated[1]
    rewards = torch.as_tensor(gathered.rewards)
    terminated = torch.as_tensor(gathered.terminated)
    target = _target(learner, rewards, terminated, torch.as_tensor(gathered.next_obs))
    assert target[0] != rewards[0]  # bootstrapped: gamma x the next value enters the target
    assert target[1] == rewards[1]  # terminated: the reward alone


def _target(learner: OffPolicyLearner, rewards, terminated, next_obs) -> torch.Tensor:
    with torch.no_grad():
        action, logp = learner.actor.policy(next_obs)
        next_q = learner.critic_target(next_obs, action)
        if hasattr(learner, "_target"):
            return learner._target(rewards, terminated, next_q, logp, learner.log_alpha.exp())
        from asyncrl.agents.off_policy.td3_loss import clipped_double_q_target

        return clipped_double_q_target(rewards, terminated, next_q, learner.cfg.gamma)


def test_redq_updates_the_actor_once_per_utd_critic_updates() -> None:
    learner = make_learner("redq", utd=4.0)
    before = [p.detach().clone() for p in learner.actor.parameters()]
    critic_before = [p.detach().clone() for p in learner.critic.parameters()]
    alpha_before = learner.entropy_alpha()
    learner.insert(make_batch())
    for k in range(1, 9):
        learner._update(learner._sample()[1])
        changed = any(not torch.equal(a, p) for a, p in zip(before, learner.actor.parameters()))
        assert changed == (k >= 4), k  # critics every update, the actor (and temperature) at updates 4 and 8
        assert any(not torch.equal(a, p) for a, p in zip(critic_before, learner.critic.parameters()))
        critic_before = [p.detach().clone() for p in learner.critic.parameters()]
    assert learner.entropy_alpha() != alpha_before
    assert learner.critic_updates == 8 and learner.state_dict()["critic_updates"] == 8


@pytest.mark.parametrize("algo", ALGOS)
def test_only_the_actor_is_published(algo: str) -> None:
    learner = make_learner(algo)
    assert isinstance(learner, Learner)
    published = flat_state(learner.policy_module())
    built = flat_state(registry.learner_class(algo).build_policy(SPEC, learner.cfg, torch.device("cpu")))
    assert [t.shape for t in published] == [t.shape for t in built]
    critic_ids = {id(t) for m in (learner.critic, learner.critic_target) for t in m.state_dict(keep_vars=True).values()}
    assert not critic_ids & {id(t) for t in published}
    assert sum(t.numel() for t in published) == sum(t.numel() for t in learner.actor.state_dict().values())
    assert learner.critic.num_critics == (10 if algo == "redq" else 2)


def test_checkpoint_state_loads_with_weights_only(tmp_path) -> None:
    learner = make_learner("sac")
    learner.train(make_batch(), 0)
    torch.save(learner.state_dict(), tmp_path / "s.pt")
    other = make_learner("sac", seed=1)
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert other.updates == learner.updates and other.version == learner.version
    assert all(torch.equal(a, b) for a, b in zip(flat_state(other.actor), flat_state(learner.actor)))


# SAC's end-to-end run, with the Q-divergence check and asyncrl-diagnose's replay section, is the learning run of
# tests/test_off_policy_checkpoints.py (test_sac_run_writes_finite_losses_and_a_diagnosis).
# Small networks and replay batches: what is checked (the processes run the learner and its finite stats reach
# metrics.jsonl) does not depend on their size, and the updates cost a fraction of the CPU: REDQ (its preset's
# utd 20: 2,000 updates of 10 critics) 12.4 -> 9.3 s, TD3 (700 updates) 11.7 -> 5.9 s. Three runs of each beside
# five others on a loaded machine all passed, with the stats of 5 (REDQ) and 9 (TD3) train() calls in metrics.jsonl
# as before.
@pytest.mark.parametrize(("algo", "args"), [
    ("redq", ["--frames", "400", "--learning-starts", "300", "--hidden-size", "32", "--sac-batch-size", "64"]),
    ("td3", ["--frames", "1000", "--learning-starts", "300", "--hidden-size", "64", "--sac-batch-size", "64"]),
])
def test_end_to_end_run_writes_finite_losses(algo: str, args: list[str], tmp_path) -> None:
    run = start_train(["--env", "Pendulum-v1", "--algo", algo, "--report-interval", "1", *args], tmp_path / "runs")
    assert run.wait(timeout=240) == 0, run.stderr()
    records = [r for r in run.records() if r.get("critic_loss") is not None]
    assert records, "no record with learner stats"
    last = records[-1]
    assert math.isfinite(last["critic_loss"]) and math.isfinite(last["alpha"]) and last["updates"] > 0
    assert last["utd_achieved"] > 0


@pytest.mark.parametrize(("env", "algo", "message"), [
    ("CartPole-v1", "sac", "--algo sac needs continuous (Box) actions"),
    ("null", "td3", "--algo td3 needs continuous (Box) actions"),
])
def test_discrete_action_spaces_are_refused_in_one_line(env: str, algo: str, message: str, tmp_path) -> None:
    result = launcher.run("train", ["--env", env, "--algo", algo, "--train-dir", str(tmp_path)], timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_replay_buffer_above_the_ram_is_refused(tmp_path) -> None:
    result = launcher.run("train", ["--env", "Pendulum-v1", "--algo", "sac", "--replay-size", str(10**12),
                                    "--train-dir", str(tmp_path)], timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the replay buffer needs" in lines[0], result.stderr


def test_the_off_policy_preset_applies_only_to_unset_flags() -> None:
    from asyncrl.resolve import config_from_flags

    cfg = config_from_flags(env="Pendulum-v1", algo="sac")
    assert (cfg.workers, cfg.envs_per_worker, cfg.rollout, cfg.batch_size, cfg.hidden_size) == (1, 8, 8, 64, 256)
    assert config_from_flags(env="Pendulum-v1", algo="sac", rollout=16, batch_size=128).rollout == 16
    assert config_from_flags(env="Pendulum-v1").hidden_size == 64  # appo keeps the vector preset
    redq = config_from_flags(env="Pendulum-v1", algo="redq")
    assert (redq.envs_per_worker, redq.batch_size, redq.rollout) == (2, 16, 8)  # 320 updates per batch at utd 20
    # over a family preset with PPO minibatching and observation and return normalisation (MuJoCo), none carries over
    cheetah = config_from_flags(env="HalfCheetah-v5", algo="sac")
    assert (cheetah.batch_size, cheetah.minibatches, cheetah.normalize_obs, cheetah.normalize_returns) == (
        64, 1, False, False)
    cheetah.validate()


@pytest.mark.parametrize("algo", ALGOS)
def test_non_finite_updates_are_skipped_and_counted(algo: str) -> None:
    learner = make_learner(algo, utd=0.5)
    before = [t.clone() for t in learner.critic.parameters()]
    batch = make_batch()
    batch.rewards[:] = float("nan")
    stats = learner.train(batch, 0)
    assert stats["updates"] == T * B // 2 and learner.nonfinite_streak == stats["updates"]
    assert all(torch.equal(a, b) for a, b in zip(before, learner.critic.parameters()))


def test_prioritized_replay_feeds_back_td_errors() -> None:
    learner = make_learner("sac", per=True, utd=1.0)
    batch = make_batch()
    batch.valid[0, 1] = False
    learner.train(batch, 0)
    tree = learner.replay.tree
    priorities = tree.get(np.arange(T * B))
    assert priorities[1 * T + 0] == 0.0  # the step in which the env raised is never drawn
    assert len(np.unique(priorities[priorities > 0])) > 1  # |TD error| replaced the uniform initial priority
    assert learner.replay.updates == learner.updates == T * B - 1  # one update per valid env step (utd 1)
