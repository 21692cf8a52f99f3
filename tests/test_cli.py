"""`asyncrl-train` as a user runs it: bad input is one line on stderr, exit code 2, and nothing half-written.

Errors found while the settings are parsed and validated come from the command's `main(argv)` called in this
process (what the console script runs, with its exit code and stderr captured). Those found later, once the env
is built (an unknown Atari game, the run directory, resume), come after the check that this process may fork
workers, which a test process that has used torch fails: they run the installed `asyncrl-train` in a process of
its own, as a user does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.train_cli import FAST, assert_user_error, main_in_process


def test_unknown_env_names_a_close_match(tmp_path: Path) -> None:
    result = run_cli([*FAST, "--env", "CartPol-v1"], tmp_path)
    assert_user_error(result, "unknown env 'CartPol-v1'", "did you mean", "CartPole-v1")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def suggestions(line: str) -> list[str]:
    """The names after "did you mean:" (the bad input itself is quoted earlier in the line)."""
    return line.split("did you mean: ", 1)[1].split("?", 1)[0].split(", ")


def test_unknown_atari_game_names_the_rom(tmp_path: Path) -> None:
    result = run_cli([*FAST, "--env", "atari_pongg"], tmp_path)
    line = assert_user_error(result, "unknown env 'atari_pongg'", "did you mean: ")
    assert "atari_pong" in suggestions(line), line


@pytest.mark.parametrize(("flags", "expected"), [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--workers", "-4"], "--workers must be at least 1"),
    (["--envs-per-worker", "-2"], "--envs-per-worker must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--frames", "-1"], "--frames must not be negative"),
    (["--lr-warmup", "-1"], "--lr-warmup must not be negative"),
    (["--activation", "gelu"], "--activation must be tanh or relu"),
    (["--rollout", "1"], "--rollout must be at least 2"),
    (["--envs-per-worker", "3", "--worker-splits", "2"], "does not divide into --worker-splits"),
    (["--batch-size", "20"], "must be a multiple of rollout x envs per split"),
    (["--minibatches", "3", "--batch-size", "32"], "--minibatches 3 must divide"),
])
def test_invalid_settings_exit_2_before_creating_anything(tmp_path: Path, flags: list[str], expected: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    train_dir = tmp_path / "runs"
    result = main_in_process([*FAST, *flags], train_dir, capsys)
    assert_user_error(result, expected)
    assert not train_dir.exists(), "a rejected run must not create its train dir"


def test_resume_with_nothing_to_resume(tmp_path: Path) -> None:
    train_dir = tmp_path / "runs"
    result = run_cli([*FAST, "--resume", "--experiment", "nothing"], train_dir)
    assert_user_error(result, "--resume", "no checkpoint", "nothing")
    assert not (train_dir / "nothing").exists()


def test_unwritable_train_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = run_cli(FAST, blocker / "runs")
    assert_user_error(result, "cannot write to train dir", "--train-dir")
    assert blocker.read_text() == "not a directory"


def test_existing_experiment_needs_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "CartPole-v1"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"frames": 123}\n')
    (run_dir / "config.json").write_text("{}")
    result = run_cli(FAST, tmp_path)
    assert_user_error(result, "already exists", "--resume", "--experiment")
    # The earlier run's files are left exactly as they were.
    assert (run_dir / "metrics.jsonl").read_text() == '{"frames": 123}\n'
    assert (run_dir / "config.json").read_text() == "{}"
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "metrics.jsonl"]


def test_help_lists_every_config_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from asyncrl.config import Config

    result = main_in_process(["--help"], tmp_path, capsys)
    assert result.returncode == 0
    for f in dataclasses.fields(Config):
        if f.metadata.get("cli", True):  # lr_base is recorded in config.json, not given
            assert "--" + f.name.replace("_", "-") in result.stdout
    assert "--lr-base" not in result.stdout
