"""The learning-rate schedules: linear decay and the KL-adaptive rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.algo.lr_schedule import KL_FACTOR, kl_adaptive_lr, linear_lr, warmup_factor


def test_linear_decays_to_zero_at_the_end() -> None:
    assert linear_lr(1e-3, 0, 1000) == pytest.approx(1e-3)
    assert linear_lr(1e-3, 250, 1000) == pytest.approx(7.5e-4)
    assert linear_lr(1e-3, 1000, 1000) == 0.0
    assert linear_lr(1e-3, 5000, 1000) == 0.0


@pytest.mark.parametrize(("kl", "expected"), [
    (0.05, 1e-3 / KL_FACTOR),  # more than 2 x target: slow down
    (0.0201, 1e-3 / KL_FACTOR),
    (0.02, 1e-3),  # within [target / 2, 2 x target]: unchanged
    (0.01, 1e-3),
    (0.005, 1e-3),
    (0.0049, 1e-3 * KL_FACTOR),  # under target / 2: speed up
    (0.0, 1e-3 * KL_FACTOR),
])
def test_kl_rule_moves_towards_the_target(kl: float, expected: float) -> None:
    assert kl_adaptive_lr(1e-3, kl, 0.01, 1e-6, 1.0) == pytest.approx(expected)


def test_kl_rule_stays_within_bounds() -> None:
    assert kl_adaptive_lr(1e-3, 0.0, 0.01, 1e-5, 1.2e-3) == pytest.approx(1.2e-3)
    assert kl_adaptive_lr(1e-5, 1.0, 0.01, 1e-5, 1e-2) == pytest.approx(1e-5)


def test_kl_rule_ignores_a_nan_kl() -> None:
    assert kl_adaptive_lr(1e-3, float("nan"), 0.01, 1e-6, 1.0) == pytest.approx(1e-3)


def test_learner_adapts_and_checkpoints_its_rate() -> None:
    """A real learner on a synthetic batch: a tiny KL raises the rate, the rate survives a state-dict round trip."""
    import gymnasium as gym

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.agents.batch import Batch
    from asyncrl.config import Config
    from asyncrl.envs.base import EnvSpec

    spec = EnvSpec("vec", (4,), np.dtype(np.float32), gym.spaces.Discrete(2), 1)
    cfg = Config(env="CartPole-v1", lr=1e-4, lr_schedule="kl", kl_target=1.0, minibatches=1, rollout=4,
                 batch_size=8, envs_per_worker=4)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    t, b = 4, 2
    batch = Batch(obs=torch.randn(t + 1, b, 4), actions=torch.randint(0, 2, (t, b)),
                  behaviour_logp=torch.full((t, b), -0.69), rewards=torch.ones(t, b),
                  terminated=torch.zeros(t, b, dtype=torch.bool), truncated=torch.zeros(t, b, dtype=torch.bool),
                  final_obs=torch.zeros(b, 4), final_step=torch.full((b,), -1), lag=torch.zeros(t, b, dtype=torch.long))
    stats = learner.train(batch, frames=0)
    assert stats["learning_rate"] == pytest.approx(1e-4)  # the rate used for this update
    assert learner.lr == pytest.approx(1e-4 * KL_FACTOR)  # KL << target / 2: the next update goes faster
    for _ in range(30):
        learner.train(batch, frames=0)
    assert learner.lr == pytest.approx(1e-3)  # capped at 10 x --lr
    other = APPOLearner(cfg, spec, torch.device("cpu"))
    other.load_state_dict(learner.state_dict())
    assert other.lr == pytest.approx(learner.lr)


def test_warmup_ramps_the_scheduled_rate() -> None:
    assert [warmup_factor(f, 1000) for f in (0, 250, 1000, 5000)] == [0.0, 0.25, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0  # --lr-warmup 0: none

    import gymnasium as gym

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.config import Config
    from asyncrl.envs.base import EnvSpec

    spec = EnvSpec("vec", (4,), np.dtype(np.float32), gym.spaces.Discrete(2), 1)
    cfg = Config(env="CartPole-v1", lr=1e-3, lr_schedule="linear", frames=10_000, lr_warmup=2_000, minibatches=1,
                 rollout=4, batch_size=8, envs_per_worker=4)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    # the ramp times the linear decay: 0.5 x 0.9 at 1,000 frames, 1 x 0.7 at 3,000
    assert learner.learning_rate(1_000) == pytest.approx(1e-3 * 0.5 * 0.9)
    assert learner.learning_rate(3_000) == pytest.approx(1e-3 * 0.7)
