"""--scale (the guide's PPO settings by env count) and --lr-scaling (learning rate by global batch)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from asyncrl.config import Config, ConfigError
from asyncrl.launch import scaling_lines
from asyncrl.resolve import parse_command_line, resume_changes
from asyncrl.scaling import MAX_ENVS_PER_WORKER, scale_note, scale_settings
from tests.conftest import run_cli

TORCHRUN_2 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def parse(*words: str) -> Config:
    """CartPole-v1 one env at a time: the `vector` preset's batch (256) is the reference these tests scale from."""
    cfg = parse_command_line(["--env", "CartPole-v1", "--env-vectorization", "loop", *words]).config
    cfg.validate()
    return cfg


def test_scale_small_applies_the_guide_row_over_the_env_preset() -> None:
    cfg = parse("--scale", "small")
    assert (cfg.lr, cfg.rollout, cfg.minibatches, cfg.epochs, cfg.gamma, cfg.vtrace_c) == (3e-4, 128, 4, 4, 0.99, 0.95)
    assert cfg.workers * cfg.envs_per_worker == 64  # the vector preset's 2 x 8 is replaced
    assert cfg.batch_size == 64 * 128  # one rollout of every env
    assert cfg.workers <= max(2, 2 * (os.cpu_count() or 1))


def test_given_flags_win_over_the_scale_preset() -> None:
    cfg = parse("--scale", "small", "--lr", "0.001", "--rollout", "64", "--workers", "2", "--gamma", "0.9")
    assert (cfg.lr, cfg.rollout, cfg.workers, cfg.gamma) == (0.001, 64, 2, 0.9)
    assert cfg.envs_per_worker == 32 and cfg.batch_size == 64 * 64
    assert cfg.epochs == 4  # not given: still the scale's


def test_medium_and_large_fit_the_machine_and_say_so() -> None:
    medium = scale_settings("medium", {}, cores=2)
    assert (medium["lr"], medium["rollout"], medium["minibatches"], medium["epochs"]) == (1e-3, 32, 4, 5)
    assert (medium["workers"], medium["envs_per_worker"]) == (4, MAX_ENVS_PER_WORKER)  # 1,024 of 4,096
    assert medium["batch_size"] == 4 * 256 * 32
    note = scale_note("medium", 4, 256)
    assert note is not None and "4,096" in note and "1,024" in note
    large = scale_settings("large", {}, cores=64)  # 128 workers x 256 = 32,768 of 65,536
    assert (large["lr"], large["rollout"], large["minibatches"]) == (3e-3, 16, 8)
    assert large["workers"] * large["envs_per_worker"] == 32_768
    assert scale_settings("large", {}, cores=256)["workers"] * scale_settings("large", {}, cores=256)[
        "envs_per_worker"] == 65_536
    assert scale_note("large", 256, 256) is None


def test_scale_halves_envs_until_the_trajectories_fit_in_memory() -> None:
    fits = lambda workers, envs, rollout, splits: workers * envs <= 100  # noqa: E731
    small = scale_settings("small", {}, cores=2, fits=fits)
    assert small["workers"] * small["envs_per_worker"] == 64
    medium = scale_settings("medium", {}, cores=2, fits=fits)
    assert (medium["workers"], medium["envs_per_worker"]) == (4, 16)


def test_scale_counts_envs_over_all_torchrun_ranks() -> None:
    per_rank = scale_settings("small", {}, cores=2, world=2)
    assert per_rank["workers"] * per_rank["envs_per_worker"] == 32
    assert scale_note("small", per_rank["workers"], per_rank["envs_per_worker"], world=2) is None


def test_lr_scaling_rules_and_the_printed_line() -> None:
    cfg = parse("--scale", "small", "--lr-scaling", "sqrt")
    assert cfg.lr_base == 3e-4 and cfg.lr == pytest.approx(3e-4 * math.sqrt(8))
    lines = scaling_lines(cfg)
    assert lines[-1] == ("scaling: 64 envs x 128 steps x 4 epochs = B_eff 32,768; global batch 8,192 = 8x the "
                         "reference 1,024 -> lr 3e-4 x sqrt(8) = 8.5e-4 (--lr-scaling sqrt)")
    linear = parse("--lr-scaling", "linear", "--batch-size", "2048", "--lr", "0.0001")
    assert linear.lr == pytest.approx(2e-4) and linear.lr_base == 1e-4
    half = parse("--lr-scaling", "sqrt", "--lr-reference-batch", "1024")  # the vector preset's batch is 256
    assert half.lr == pytest.approx(1e-3 * 0.5)
    assert parse("--scale", "small").lr == 3e-4
    # printed at every start, the rule included (here none: one rank on the preset's batch)
    assert scaling_lines(parse()) == ["scaling: 16 envs x 16 steps x 8 epochs = B_eff 2,048; global batch 256 -> "
                                      "lr 1e-3 (--lr-scaling none)"]


def torchrun(monkeypatch: pytest.MonkeyPatch, ranks: int) -> None:
    """This process as rank 0 of `ranks` (no torchrun variables for 1)."""
    for name, value in TORCHRUN_2.items():
        if ranks > 1:
            monkeypatch.setenv(name, str(ranks) if name == "WORLD_SIZE" else value)
        else:
            monkeypatch.delenv(name, raising=False)


def rule(cfg: Config) -> tuple[str, int, float, float]:
    return cfg.lr_scaling, cfg.lr_reference_batch, cfg.lr_base, cfg.lr


def test_sqrt_is_the_default_once_the_global_batch_exceeds_the_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    torchrun(monkeypatch, 1)  # one rank on the preset's batch: the settings as they were
    assert rule(parse()) == ("none", 1024, 0.0, 1e-3)
    assert json.loads(parse().to_json())["lr"] == 1e-3
    assert rule(parse_command_line(["--env", "atari_pong"]).config) == ("none", 1024, 0.0, 2.5e-4)
    assert rule(parse("--scale", "small")) == ("none", 1024, 0.0, 3e-4)  # the row's batch is its reference
    assert rule(parse("--batch-size", "512")) == ("sqrt", 256, 1e-3, pytest.approx(1e-3 * math.sqrt(2)))

    torchrun(monkeypatch, 2)  # 2 ranks x the vector preset's 256 = 2 x its batch
    cfg = parse()
    assert rule(cfg) == ("sqrt", 256, 1e-3, pytest.approx(1e-3 * math.sqrt(2)))
    assert scaling_lines(cfg) == ["scaling: 32 envs x 16 steps x 8 epochs = B_eff 4,096; global batch 512 (2 ranks "
                                  "x 256) = 2x the reference 256 -> lr 1e-3 x sqrt(2) = 1.4e-3 (--lr-scaling sqrt)"]
    resumed = Config(**json.loads(cfg.to_json())).resolve()  # as config.json is read back: not scaled twice
    assert rule(resumed) == rule(cfg)
    atari = parse_command_line(["--env", "atari_pong"]).config  # the Config default batch, 1024
    assert rule(atari) == ("sqrt", 1024, 2.5e-4, pytest.approx(2.5e-4 * math.sqrt(2)))
    assert rule(parse("--batch-size", "128")) == ("none", 1024, 0.0, 1e-3)  # 256 in all: not over the reference
    assert rule(parse("--scale", "small")) == ("none", 1024, 0.0, 3e-4)  # each rank hosts half the row's envs
    assert rule(parse("--lr-reference-batch", "128")) == ("sqrt", 128, 1e-3, pytest.approx(2e-3))

    # a given rule or rate wins over the default
    assert rule(parse("--lr-scaling", "none")) == ("none", 1024, 0.0, 1e-3)
    assert rule(parse("--lr", "0.001")) == ("none", 1024, 0.0, 1e-3)
    assert rule(parse("--lr-scaling", "linear")) == ("linear", 1024, 1e-3, pytest.approx(5e-4))  # vs 1,024
    assert rule(parse("--lr-scaling", "sqrt", "--lr", "0.002", "--lr-reference-batch", "256")) == (
        "sqrt", 256, 2e-3, pytest.approx(2e-3 * math.sqrt(2)))
    sac = parse_command_line(["--env", "Pendulum-v1", "--algo", "sac"]).config  # replay: not a gradient batch
    assert rule(sac) == ("none", 1024, 0.0, 3e-4)

    torchrun(monkeypatch, 4)
    assert rule(parse()) == ("sqrt", 256, 1e-3, pytest.approx(2e-3))  # sqrt(4 x 256 / 256)


def test_lr_scaling_uses_the_global_batch_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_2.items():
        monkeypatch.setenv(name, value)
    cfg = parse("--lr-scaling", "linear", "--batch-size", "512", "--lr-reference-batch", "256")
    assert cfg.lr == pytest.approx(1e-3 * 4)  # 2 ranks x 512 = 4 x 256


def test_bad_scaling_flags_are_one_line_errors() -> None:
    for words, expected in ((["--scale", "huge"], "--scale must be"), (["--lr-scaling", "log"], "--lr-scaling must"),
                            (["--lr-reference-batch", "0"], "--lr-reference-batch must"),
                            (["--value-transform", "log"], "--value-transform must"),
                            (["--clip-reference", "behaviour"], "--clip-reference must be acting or learner"),
                            (["--scale", "small", "--minibatches", "3"], "--minibatches 3 must divide")):
        with pytest.raises(ConfigError, match=expected):
            parse(*words)


def test_resume_does_not_scale_twice(tmp_path: Path) -> None:
    common = ["--env", "CartPole-v1", "--experiment", "s", "--workers", "1", "--envs-per-worker", "2",
              "--rollout", "8", "--batch-size", "64", "--minibatches", "1", "--epochs", "1",
              "--lr-scaling", "linear", "--lr-reference-batch", "16", "--lr", "0.0001"]
    first = run_cli([*common, "--frames", "400"], tmp_path, timeout=180)
    assert first.returncode == 0, first.stderr
    assert ("scaling: 2 envs x 8 steps x 1 epochs = B_eff 16; global batch 64 = 4x the reference 16 -> "
            "lr 1e-4 x 4 = 4e-4 (--lr-scaling linear)") in first.stdout
    saved = json.loads((tmp_path / "s" / "config.json").read_text())
    assert saved["lr"] == pytest.approx(4e-4) and saved["lr_base"] == 1e-4

    # The resumed run's settings, resolved as asyncrl-train resolves them: the lines it prints for what changed
    # (launch.run prints resume_changes) and the config.json its runner writes (cfg.to_json()).
    resumed = parse_command_line(["--resume", "--experiment", "s", "--env", "CartPole-v1", "--frames", "800",
                                  "--train-dir", str(tmp_path)]).config
    assert not [line for line in resume_changes(resumed) if line.startswith(("lr:", "lr_base:"))]
    assert json.loads(resumed.to_json())["lr"] == pytest.approx(4e-4) and resumed.lr_base == 1e-4

    again = parse_command_line(["--resume", "--experiment", "s", "--env", "CartPole-v1", "--train-dir",
                                str(tmp_path), "--lr", "0.0002"]).config
    assert again.lr == pytest.approx(8e-4) and again.lr_base == 2e-4  # a given --lr is the new base
    off = parse_command_line(["--resume", "--experiment", "s", "--env", "CartPole-v1", "--train-dir",
                              str(tmp_path), "--lr-scaling", "none"]).config
    assert off.lr == pytest.approx(1e-4)


def test_a_batched_env_hosts_the_full_medium_and_large_env_counts() -> None:
    for scale, envs in (("medium", 4096), ("large", 65_536)):
        s = scale_settings(scale, {}, cores=2, batched=True)  # one VectorEnv call a split step: no 256 cap
        assert s["workers"] == 2 and s["workers"] * s["envs_per_worker"] == envs
    cfg = parse_command_line(["--env", "CartPole-v1", "--scale", "large"]).config  # batched: its vector_entry_point
    assert cfg.workers * cfg.envs_per_worker == 65_536 and cfg.batch_size == 65_536 * 16
    assert scale_note("large", cfg.workers, cfg.envs_per_worker) is None
    loop = parse("--scale", "large")  # one env at a time
    assert loop.envs_per_worker == MAX_ENVS_PER_WORKER
