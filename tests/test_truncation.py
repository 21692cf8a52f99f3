"""Time limits are truncations, not terminations: the maths, the env backend, and the learner's data path."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.agents.batch import gather_batch
from asyncrl.algo.time_limits import episode_end_inputs
from asyncrl.algo.vtrace import vtrace
from asyncrl.config import Config
from asyncrl.envs.gym_env import GymVecEnv
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.plumbing.trajectories import NO_FINAL, allocate_trajectories
from asyncrl.runtime.stages.rollout import keep_final_obs

GAMMA = 0.98
V_TRUE = -1.0 / (1.0 - GAMMA)  # -50: reward -1 every step, forever


def chain_targets(terminated: list[bool], truncated: list[bool], final_value: float, has_final: list[bool]):
    """V-trace on a stationary chain (reward -1, V exact everywhere), on-policy, one env."""
    t = len(terminated)
    col = lambda xs: torch.tensor(xs).reshape(t, 1)  # noqa: E731
    values = torch.full((t, 1), V_TRUE)
    rewards, discounts = episode_end_inputs(
        torch.full((t, 1), -1.0), values, col(terminated), col(truncated), torch.full((t, 1), final_value),
        col(has_final), GAMMA)
    zeros = torch.zeros(t, 1)
    return vtrace(zeros, zeros, rewards, values, torch.full((1,), V_TRUE), discounts)


def test_truncated_step_bootstraps_from_the_final_observation() -> None:
    out = chain_targets([False] * 5, [False, False, True, False, False], V_TRUE, [False, False, True, False, False])
    assert out.vs[2, 0].item() == pytest.approx(-1.0 + GAMMA * V_TRUE)  # = V_TRUE: nothing to learn
    assert out.vs[:, 0].tolist() == pytest.approx([V_TRUE] * 5)
    assert out.pg_advantages.abs().max().item() == pytest.approx(0.0, abs=1e-5)
    other = chain_targets([False] * 5, [False, False, True, False, False], -40.0, [False, False, True, False, False])
    assert other.vs[2, 0].item() == pytest.approx(-1.0 + GAMMA * -40.0)  # V(final), not V of the next episode


def test_terminated_step_targets_the_reward_alone() -> None:
    out = chain_targets([False, False, True, False, False], [False] * 5, V_TRUE, [False] * 5)
    assert out.vs[2, 0].item() == pytest.approx(-1.0)
    assert out.pg_advantages[2, 0].item() == pytest.approx(-1.0 - V_TRUE)


def test_truncation_without_final_obs_is_masked_and_cuts_the_trace() -> None:
    t, b = 5, 1
    truncated = torch.tensor([False, False, True, False, False]).reshape(t, b)
    values = torch.full((t + 1, b), V_TRUE, requires_grad=True)
    logp = torch.zeros(t, b, requires_grad=True)
    hp = APPOHyperparams(gamma=GAMMA, normalize_advantages=False)
    _, stats = appo_loss(logp, torch.zeros(t, b), values, torch.zeros(t, b), torch.full((t, b), -1.0),
                         torch.zeros(t, b, dtype=torch.bool), torch.ones(t, b), hp, truncated=truncated)
    out = chain_targets([False] * 5, truncated.flatten().tolist(), 0.0, [False] * 5)
    assert out.vs[:, 0].tolist() == pytest.approx([V_TRUE] * 5)  # V(x_2) stands in for the unknown V(final)
    assert stats["value_target_mean"].item() == pytest.approx(V_TRUE)


class LastStepReturn(gym.Wrapper):
    """Records the observation each `step` returned (before GymVecEnv's auto-reset replaces it)."""

    def step(self, action):
        out = super().step(action)
        self.returned = np.array(out[0])
        return out


def pendulum_cut_at(steps: int) -> gym.Env:
    return LastStepReturn(gym.make("Pendulum-v1", max_episode_steps=steps))


def test_time_limit_is_a_truncation_with_the_final_observation() -> None:
    env = GymVecEnv("Pendulum-v1", lambda: pendulum_cut_at(3), 2)
    n = env.num_envs
    obs = np.zeros((n, 3), np.float32)
    rew, term, trunc = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
    final = np.full((n, 3), 99.0, np.float32)
    env.reset(0, obs)
    for _ in range(2):
        env.step(np.ones((n, 1), np.float32), obs, rew, term, trunc, final)
        assert not trunc.any() and not term.any() and (final == 99.0).all()  # untouched until a cut
    stats = env.step(np.ones((n, 1), np.float32), obs, rew, term, trunc, final)
    assert trunc.all() and not term.any()
    assert [(s.length, s.truncated) for s in stats] == [(3, True)] * n
    for i, wrapped in enumerate(env.envs):
        np.testing.assert_array_equal(final[i], wrapped.returned.astype(np.float32))
        assert not np.array_equal(obs[i], final[i])  # obs_out already holds the next episode's first obs
    env.close()


def test_learner_bootstraps_from_the_stored_final_observation() -> None:
    """Real backend -> real slot (as the rollout worker fills it) -> gather_batch -> the learner's targets."""
    cfg = Config(env="Pendulum-v1", workers=1, envs_per_worker=2, worker_splits=1, rollout=4, batch_size=8,
                 minibatches=1, gamma=GAMMA)
    cfg.validate()
    spec = make_env_spec(cfg.env)
    traj = allocate_trajectories(cfg, spec)
    env = GymVecEnv("Pendulum-v1", lambda: pendulum_cut_at(2), 2)  # 4 steps: truncations at t = 1 and t = 3
    slot = 1
    assert (traj["final_step"] == NO_FINAL).all()
    scratch = np.zeros((2, *spec.obs_shape), np.float32)
    env.reset(0, traj["obs"][slot, 0])
    returned = {}
    for t in range(cfg.rollout):
        traj["actions"][slot, t] = 0.5
        env.step(traj["actions"][slot, t], traj["obs"][slot, t + 1], traj["rewards"][slot, t],
                 traj["terminated"][slot, t], traj["truncated"][slot, t], scratch)
        keep_final_obs(slot, t, traj["truncated"], scratch, traj["final_obs"], traj["final_step"])
        returned[t] = np.stack([e.returned for e in env.envs]).astype(np.float32)
    env.close()
    assert traj["truncated"][slot, :, 0].tolist() == [False, True, False, True]
    assert traj["final_step"][slot].tolist() == [1, 1]  # the first cut is kept, the second has none
    np.testing.assert_array_equal(traj["final_obs"][slot], returned[1])

    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    batch = gather_batch(traj, np.array([slot]), version=1, device=torch.device("cpu"))
    np.testing.assert_array_equal(batch.final_obs.numpy(), returned[1])
    has_final = batch.has_final()
    assert has_final[:, 0].tolist() == [False, True, False, False]  # t = 3 is a truncation without final obs
    with torch.no_grad():
        _, v_final = learner.model(torch.from_numpy(returned[1]))
        _, values = learner.model(batch.obs.reshape(-1, *spec.obs_shape))
        final_values = learner._final_values(batch, has_final)
    rewards, discounts = episode_end_inputs(batch.rewards, values.reshape(5, 2)[:-1], batch.terminated,
                                            batch.truncated, final_values, has_final, GAMMA)
    expected = batch.rewards[1] + GAMMA * v_final.reshape(-1)
    torch.testing.assert_close(rewards[1], expected)
    assert discounts[1].tolist() == [0.0, 0.0] and discounts[3].tolist() == [0.0, 0.0]
    stats = learner.train(batch, frames=0)
    assert stats["truncations"] == 4 and stats["truncations_unbootstrapped"] == 2


def test_atari_frame_cap_is_a_truncation() -> None:
    pytest.importorskip("ale_py")
    from asyncrl.envs.registry import make_vec_env

    env = make_vec_env("atari_pong", 2, max_episode_frames=400)  # 100 agent steps at frameskip 4
    obs = np.zeros((2, *env.spec.obs_shape), np.uint8)
    rew, term, trunc = np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool)
    final = np.zeros_like(obs)
    env.reset(0, obs)
    before = obs.copy()
    for step in range(1, 101):
        before = obs.copy()
        stats = env.step(np.zeros(2, np.int64), obs, rew, term, trunc, final)
        if step < 100:
            assert not trunc.any() and not term.any()
    env.close()
    assert trunc.all() and not term.any()
    assert [(s.length, s.truncated) for s in stats] == [(100, True)] * 2
    # the final frame stack continues the one before it (shifted by one frame); the new game's does not
    np.testing.assert_array_equal(final[:, :3], before[:, 1:])
    assert not np.array_equal(obs[:, :3], before[:, 1:])
