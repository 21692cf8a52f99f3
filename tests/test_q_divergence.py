"""Q divergence of the off-policy critics: Monte-Carlo returns over the replay ring, the ensemble reduction, the
relative overestimate, the health alert and the diagnosis. In-process and fast."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asyncrl.algo.q_divergence import divergence, ensemble_estimate, episode_returns
from asyncrl.diagnostics.bottleneck import classify
from asyncrl.diagnostics.health import Thresholds, critic_settle_updates, detect
from asyncrl.diagnostics.report import off_policy_section
from asyncrl.diagnostics.tb_tags import tb_tag
from asyncrl.replay.buffer import ReplayBuffer

T = 2
GAMMA = 0.5


def chunk(first: list[float], rewards: list[list[float]], terminated=(), truncated=()) -> dict:
    """One time-major chunk of B = len(first) envs, T steps; observation o = [column, first + t] (unique)."""
    b = len(first)
    obs = np.array([[[j, first[j] + t] for j in range(b)] for t in range(T + 1)], np.float32)
    term = np.zeros((T, b), bool)
    trunc = np.zeros((T, b), bool)
    for t, j in terminated:
        term[t, j] = True
    for t, j in truncated:
        trunc[t, j] = True
    final = np.array([[99.0, 99.0]] * int(trunc.sum()), np.float32)
    return dict(obs=obs, actions=np.zeros((T, b, 1), np.float32), rewards=np.array(rewards, np.float32).reshape(T, b),
                terminated=term, truncated=trunc, final_obs=final)


def hand_built_buffer() -> ReplayBuffer:
    """Three envs over two inserts (segments 0-2, then 3-5): env 0 terminates, env 1 is cut by a time limit, env 2
    is still running. Rewards env 0: 1, 2 | 4, 8 (terminated after the 8); env 1: 1, 1 | 1, 1 (cut after the last)."""
    buf = ReplayBuffer(64, (2,), np.float32, (1,), np.float32, segment_len=T)
    buf.insert(**chunk([0, 10, 20], [[1, 1, 5], [2, 1, 5]]))
    buf.insert(**chunk([2, 12, 22], [[4, 1, 5], [8, 1, 5]], terminated=[(1, 0)], truncated=[(1, 1)]))
    return buf


def returns_of(buf: ReplayBuffer, indices: list[int], **kw):
    return episode_returns(buf.rewards, buf.terminated, buf.truncated, buf.sampleable, buf.next_segment,
                           np.array(indices), GAMMA, **kw)


def test_segments_of_one_env_are_linked_by_their_shared_observation() -> None:
    buf = hand_built_buffer()
    assert buf.next_segment[:6].tolist() == [3, 4, 5, -1, -1, -1]


def test_monte_carlo_returns_on_a_hand_built_buffer() -> None:
    buf = hand_built_buffer()
    # env 0 (segments 0 then 3): G = 1 + 2/2 + 4/4 + 8/8 = 4 from the start; 6, 8, 8 from the later steps
    g, complete, boot, weight = returns_of(buf, [0, 1, 6, 7])
    assert g.tolist() == [4.0, 6.0, 8.0, 8.0] and complete.all() and (boot == -1).all() and (weight == 0).all()
    # env 1 (segments 1 then 4), cut after flat step 9: reward sums 1 + 1/2 + 1/4 + 1/8, bootstrapped with
    # gamma^k V(final obs): k = 4 from the first step (weight 1/16), 1 from the cut step itself (weight 1/2)
    g, complete, boot, weight = returns_of(buf, [2, 9])
    assert g.tolist() == [1.875, 1.0] and complete.all()
    assert boot.tolist() == [9, 9] and weight.tolist() == [1 / 16, 0.5]
    # the critic may supply at most max_bootstrap_weight of the return: the cut step itself is then left out
    _, complete, boot, _ = returns_of(buf, [2, 9], max_bootstrap_weight=0.3)
    assert complete.tolist() == [True, False] and boot.tolist() == [9, -1]
    # a soft critic's entropy bonus (here 1 per step) counts from the second step on
    g, _, _, _ = returns_of(buf, [0, 7], bonus=np.ones_like(buf.rewards))
    assert g.tolist() == [1 + (2 + 1) / 2 + (4 + 1) / 4 + (8 + 1) / 8, 8.0]
    # env 2 has not finished its episode: no return
    g, complete, _, _ = returns_of(buf, [4, 5, 10, 11])
    assert not complete.any() and (g == 0).all()


def test_an_unsampleable_step_or_a_missing_link_leaves_the_return_out() -> None:
    buf = hand_built_buffer()
    buf.sampleable.flat[7] = False  # env 0's last step (the env raised in it)
    _, complete, _, _ = returns_of(buf, [0, 6])
    assert not complete.any()
    buf = hand_built_buffer()
    buf.next_segment[0] = -1
    _, complete, _, _ = returns_of(buf, [0, 1, 6])
    assert complete.tolist() == [False, False, True]


def test_ambiguous_or_overwritten_predecessors_are_not_linked() -> None:
    buf = ReplayBuffer(64, (2,), np.float32, (1,), np.float32, segment_len=T)
    twins = chunk([0, 0], [[1, 1], [1, 1]])
    twins["obs"][:, :, 0] = 0  # two envs with the same observations: which one continues is unknowable
    buf.insert(**twins)
    nxt = chunk([2], [[1], [1]])
    buf.insert(**nxt)
    assert buf.next_segment[:3].tolist() == [-1, -1, -1]
    ring = ReplayBuffer(2 * T, (2,), np.float32, (1,), np.float32, segment_len=T)  # 2 segments
    ring.insert(**chunk([0], [[1], [1]]))
    ring.insert(**chunk([100], [[1], [1]]))
    ring.insert(**chunk([200], [[1], [1]]))  # overwrites segment 0
    ring.insert(**chunk([2], [[1], [1]]))  # would continue the overwritten segment
    assert ring.next_segment.tolist() == [-1, -1]


def test_ensemble_estimate_matches_the_target_reduction() -> None:
    q = np.array([[1.0, 5.0], [2.0, 4.0], [3.0, 6.0]])
    assert ensemble_estimate(q).tolist() == [1.0, 4.0]  # min over all (SAC, TD3)
    # REDQ: expected min over a random 2 of 3 = mean of the 3 pairs' minima
    assert np.allclose(ensemble_estimate(q, 2), [(1 + 1 + 2) / 3, (4 + 4 + 5) / 3])
    rng = np.random.default_rng(0)
    q10 = rng.normal(size=(10, 4))
    pairs = [np.minimum(q10[i], q10[j]) for i in range(10) for j in range(i + 1, 10)]
    assert np.allclose(ensemble_estimate(q10, 2), np.mean(pairs, axis=0))
    with pytest.raises(ValueError):
        ensemble_estimate(q, 4)


def test_divergence_is_the_relative_overestimate() -> None:
    assert divergence(np.array([3.0, 5.0]), np.array([2.0, 2.0])) == {"q_mean": 4.0, "q_return_mean": 2.0,
                                                                      "q_divergence": 1.0}
    assert divergence(np.array([-90.0]), np.array([-100.0]))["q_divergence"] == pytest.approx(0.1)
    assert divergence(np.array([0.5]), np.array([0.1]))["q_divergence"] == pytest.approx(0.4)  # scale floor 1
    assert divergence(np.array([1.0, 1.0]), np.array([2.0, -2.0]))["q_divergence"] == 0.5  # mean |G|, not |mean G|
    assert divergence(np.array([]), np.array([])) == {}


def test_the_learner_reports_q_divergence_and_it_tracks_a_critic_offset() -> None:
    from tests.off_policy_batches import make_batch, make_learner

    learner = make_learner("sac", utd=1e-9)
    first_slot, second_slot = make_batch(seed=0), make_batch(seed=1)  # the same 4 envs, one slot after the other
    second_slot.obs[0] = first_slot.obs[-1]
    second_slot.terminated[-1] = True  # every episode ends in the second slot
    first_slot.behaviour_logp = torch.randn(first_slot.rewards.shape)
    for batch in (first_slot, second_slot):
        learner.train(batch, 0)
    b = first_slot.rewards.shape[1]  # the first slot's env b is segment b; its acting log-probs are kept
    assert np.array_equal(learner.behaviour_logp[:b], first_slot.behaviour_logp.numpy().T)
    learner.check_rng = np.random.default_rng(0)
    first = learner.q_divergence_stats()
    assert set(first) == {"q_mean", "q_return_mean", "q_divergence"} and all(map(math.isfinite, first.values()))
    scale = (first["q_mean"] - first["q_return_mean"]) / first["q_divergence"]  # max(mean |G|, 1)
    assert scale >= 1.0 - 1e-9
    with torch.no_grad():
        learner.critic.layers[-1].bias += 10.0  # every critic 10 higher
    learner.check_rng = np.random.default_rng(0)  # the same transitions: their returns are exact (all terminated)
    shifted = learner.q_divergence_stats()
    assert shifted["q_return_mean"] == pytest.approx(first["q_return_mean"])
    assert shifted["q_mean"] == pytest.approx(first["q_mean"] + 10.0, rel=1e-5)
    assert shifted["q_divergence"] == pytest.approx(first["q_divergence"] + 10.0 / scale, rel=1e-4)


def test_the_check_judges_only_the_newest_transitions() -> None:
    from tests.off_policy_batches import make_batch, make_learner

    learner = make_learner("sac", utd=1e-9)
    old, new = make_batch(seed=0), make_batch(seed=1)  # two slots of whole episodes: -10 a step, then +1 a step
    for batch, reward in ((old, -10.0), (new, 1.0)):
        batch.rewards.fill_(reward)
        batch.terminated[-1] = True
        learner.train(batch, 0)
    steps = new.rewards.numel()
    assert np.array_equal(np.sort(learner.buffer.recent_indices(steps)), np.arange(steps, 2 * steps))
    learner.q_check_window = steps  # the newest slot only: every return is positive
    assert learner.q_divergence_stats()["q_return_mean"] > 0
    learner.q_check_window = 2 * steps  # both slots: the old policy's returns pull the mean below zero
    assert learner.q_divergence_stats()["q_return_mean"] < 0
    assert learner.q_check_window > 0 and make_learner("sac", gamma=1.0).q_check_window > 0


def test_the_alert_fires_only_after_consecutive_high_reports_once_the_critics_settled() -> None:
    th = Thresholds(q_divergence=0.5, q_divergence_records=3, q_divergence_min_updates=1000)
    high = [{"q_divergence": 0.8, "utd_achieved": 20.0, "updates_total": 1000 + i} for i in range(3)]
    alerts = {a.code: a for a in detect(high, th)}
    assert "q_divergence" in alerts
    line = alerts["q_divergence"].line()
    assert "UTD 20" in line and "lower --utd" in line and "\n" not in line
    gaps = [high[0], {}, high[1], {"updates_total": 1010}, high[2]]  # reports without a check in between
    assert "q_divergence" in {a.code for a in detect(gaps, th)}
    early = [{**r, "updates_total": 999} for r in high]  # a critic still learning the return's scale
    for records in (high[:2], [high[0], {**high[1], "q_divergence": 0.4}, high[2]], early):
        assert "q_divergence" not in {a.code for a in detect(records, th)}
    assert not detect(high, Thresholds(q_divergence=0.0))  # 0 switches it off
    assert critic_settle_updates(0.99, 0.005) == 20_000 and critic_settle_updates(1.0, 0.005) == 0


def test_fields_have_a_tensorboard_namespace_and_diagnose_shows_them() -> None:
    assert tb_tag("q_divergence") == "replay/q_divergence" and tb_tag("utd_achieved") == "replay/utd_achieved"
    records = [{"replay_size": 1000 * i, "utd_achieved": 1.0, "sample_age_mean": 300.0, "q_mean": -50.0 + 40 * i,
                "q_return_mean": -60.0, "q_divergence": (10.0 + 40 * i) / 60, "updates_total": 1000 * i}
               for i in range(1, 5)]
    text = "\n".join(off_policy_section(records, Thresholds()))
    assert "achieved UTD" in text and "replay size" in text and "sample age" in text and "Q divergence" in text
    assert "Q-divergence alert" in text and "lower --utd" in text
    assert off_policy_section([{"episode_return_mean": 1.0}], Thresholds()) == []


def test_the_training_bound_verdict_names_the_replay_stages() -> None:
    m = {"rollout_env_frac": 0.1, "policy_infer_frac": 0.05, "learner_wait_frac": 0.02, "learner_copy_frac": 0.01,
         "learner_train_frac": 0.97, "learner_insert_frac": 0.02, "learner_sample_frac": 0.15,
         "learner_update_frac": 0.8}
    verdict = classify(m)
    assert verdict is not None and verdict.kind == "training"
    assert "replay insert 2%, sample 15%, update 80%" in verdict.reason and "--utd" in verdict.remedy


def test_the_alert_threshold_comes_from_the_flag_in_the_run_and_in_diagnose() -> None:
    from asyncrl.config import Config, ConfigError
    from asyncrl.diagnostics.monitor import RunMonitor
    from asyncrl.diagnostics.report import thresholds
    from asyncrl.envs.registry import make_env_spec

    cfg = Config(env="Pendulum-v1", algo="sac", q_divergence_alert=0.2).resolve()
    th = RunMonitor(cfg, make_env_spec("Pendulum-v1"), out=lambda *a, **k: None).thresholds
    assert th.q_divergence == 0.2 and th.q_divergence_min_updates == 20_000
    th = thresholds({"q_divergence_alert": 0.2, "gamma": 0.99, "tau": 0.005})
    assert th.q_divergence == 0.2 and th.q_divergence_min_updates == 20_000
    assert thresholds({}).q_divergence == Thresholds().q_divergence
    cfg.q_divergence_alert = -1.0
    with pytest.raises(ConfigError, match="--q-divergence-alert must not be negative"):
        cfg.validate()
