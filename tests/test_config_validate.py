"""Config.validate: impossible settings refused in one line, consistent ones accepted, and the automatic
--envs-per-worker always valid."""

from __future__ import annotations

import pytest

from asyncrl.config import Config, ConfigError

# Explicit sampling sizes, so the expected messages do not depend on the automatic --envs-per-worker.
BASE = {"workers": 4, "envs_per_worker": 4, "worker_splits": 2, "rollout": 32, "batch_size": 1024, "minibatches": 4}


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"rollout": 1}, "--rollout must be at least 2"),
    ({"rollout": 0}, "--rollout must be at least 2"),
    ({"workers": 0}, "--workers must be at least 1"),
    ({"workers": -3}, "--workers must be at least 1"),
    ({"envs_per_worker": -2}, "--envs-per-worker must be at least 1"),
    ({"policy_workers": 0}, "--policy-workers must be at least 1"),
    ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"epochs": -1}, "--epochs must be at least 1"),
    ({"minibatches": 0}, "--minibatches must be at least 1"),
    ({"frames": -1}, "--frames must not be negative"),
    ({"seconds": -5.0}, "--seconds must not be negative"),
    ({"max_policy_lag": -1}, "--max-policy-lag must not be negative"),
    ({"lr": 0.0}, "--lr must be positive"),
    ({"gamma": 1.5}, "--gamma must be in [0, 1]"),
    ({"envs_per_worker": 3, "worker_splits": 2}, "does not divide into --worker-splits"),
    ({"envs_per_worker": 2, "worker_splits": 4}, "does not divide into --worker-splits"),
    ({"batch_size": 1000}, "try --batch-size 1024"),  # 32 steps x 2 envs = 64 samples per trajectory
    ({"batch_size": 10}, "try --batch-size 64"),
    ({"batch_size": 192, "minibatches": 4}, "--minibatches 4 must divide the 6 env columns of a batch (3 traj"),
    ({"device": "tpu"}, "--device must be auto, cpu or cuda"),
    ({"lr_schedule": "linear"}, "needs --frames"),
    ({"lr_schedule": "cosine"}, "--lr-schedule must be kl, constant, linear or auto"),
    ({"kl_target": 0.0}, "--kl-target must be positive"),
    ({"rollout_nice": 20}, "--rollout-nice must be in 0..19"),
    ({"policy_nice": -1}, "--policy-nice must be in 0..19"),
])
def test_validate_rejects_impossible_settings(overrides: dict, expected: str) -> None:
    cfg = Config(**{**BASE, **overrides})
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("overrides", [
    {},
    {"workers": 32, "envs_per_worker": 2, "batch_size": 1024},
    {"rollout": 2, "envs_per_worker": 1, "worker_splits": 1, "batch_size": 2, "minibatches": 1},
    {"batch_size": 256, "rollout": 16, "minibatches": 4, "epochs": 8},
    {"lr_schedule": "linear", "frames": 1000, "device": "cuda:1"},
])
def test_validate_accepts_consistent_settings(overrides: dict) -> None:
    cfg = Config(**{**BASE, **overrides})
    cfg.validate()
    assert cfg.trajectories_per_batch * cfg.rollout * cfg.envs_per_split == cfg.batch_size


@pytest.mark.parametrize(("workers", "batch_size", "rollout"), [(1, 1024, 32), (4, 1024, 32), (32, 1024, 32),
                                                                 (2, 256, 16), (64, 512, 64)])
def test_automatic_envs_per_worker_gives_a_valid_config(workers: int, batch_size: int, rollout: int) -> None:
    cfg = Config(workers=workers, batch_size=batch_size, rollout=rollout, minibatches=1, envs_per_worker=0).resolve()
    assert cfg.envs_per_worker >= cfg.worker_splits
    cfg.validate()


def test_a_batch_not_given_is_derived_as_whole_trajectories_that_split_into_minibatches() -> None:
    """`--envs-per-worker 2048` needs no hand-computed --batch-size; a given one is still checked."""
    from asyncrl.resolve import parse_config

    cfg = parse_config(["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2048"])
    cfg.validate()
    assert (cfg.batch_size, cfg.trajectories_per_batch) == (16 * 1024, 1)
    cfg = parse_config(["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "6"])
    cfg.validate()  # 3 envs a split: whole trajectories whose env columns divide into 4 minibatches
    assert cfg.batch_size % (cfg.rollout * 3) == 0 and (cfg.trajectories_per_batch * 3) % cfg.minibatches == 0
    assert cfg.batch_size >= Config(env="CartPole-v1").batch_size
    with pytest.raises(ConfigError, match="try --batch-size 16384"):
        parse_config(["--env", "CartPole-v1", "--envs-per-worker", "2048", "--batch-size", "1000"]).validate()
