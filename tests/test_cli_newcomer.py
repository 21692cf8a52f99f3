"""What a newcomer types in the first hour: misspelt flags and bare env names get the flag meant, counts take
`1e6` and `1_000_000`, impossible settings stop in one line before anything starts, and a file of another format
is named as such. Each case calls `asyncrl-train`'s `main(argv)` in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import Config
from asyncrl.preflight import lag_warning
from asyncrl.resolve import parse_config
from tests.train_cli import FAST, assert_user_error, main_in_process


@pytest.mark.parametrize("flags, fragment", [
    (["--frame", "1000"], "did you mean --frames?"),
    (["--sed", "3"], "did you mean --seed?"),
    (["--hiden-size", "32"], "did you mean --hidden-size?"),
])
def test_a_misspelt_flag_names_the_flag_meant(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                              fragment: str) -> None:
    result = main_in_process([*FAST, *flags], tmp_path / "runs", capsys)
    assert_user_error(result, "unrecognized arguments", flags[0], fragment)
    assert not (tmp_path / "runs").exists()


def test_a_bare_env_name_is_shown_as_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = main_in_process(["CartPole-v1"], tmp_path / "runs", capsys)
    assert_user_error(result, "takes no positional arguments", "--env CartPole-v1")


@pytest.mark.parametrize("text", ["1e6", "1_000_000", "1000000", "1.0e6"])
def test_counts_take_float_notation_and_underscores(text: str) -> None:
    assert parse_config(["--env", "CartPole-v1", "--frames", text]).frames == 1_000_000


def test_settings_files_and_the_python_api_take_whole_floats_for_counts(tmp_path: Path) -> None:
    from asyncrl.resolve import config_from_flags

    path = tmp_path / "run.json"
    path.write_text('{"env": "CartPole-v1", "frames": 1e6}')
    assert parse_config(["--config", str(path)]).frames == 1_000_000
    assert config_from_flags(env="CartPole-v1", frames=2e6).frames == 2_000_000


def test_a_fractional_count_is_refused_as_a_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = main_in_process([*FAST, "--frames", "1.5e0"], tmp_path / "runs", capsys)
    line = assert_user_error(result, "--frames: invalid int value: '1.5e0'")
    assert "spelled out" not in line  # a bad value is not a spelling mistake


@pytest.mark.parametrize("flags, fragment", [
    (["--seed", "-1"], "--seed must be in 0..2147483647 (got -1)"),
    (["--hidden-size", "0"], "--hidden-size must be at least 1 (got 0)"),
])
def test_impossible_settings_stop_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         flags: list[str], fragment: str) -> None:
    result = main_in_process([*FAST, *flags], tmp_path / "runs", capsys)
    assert_user_error(result, fragment)
    assert not (tmp_path / "runs").exists()


def test_lag_zero_with_asynchronous_workers_is_warned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lag_warning(Config(env="CartPole-v1")) is None  # the default bound of 4
    assert lag_warning(Config(env="CartPole-v1", max_policy_lag=0, deterministic=True)) is None  # lockstep
    assert lag_warning(Config(env="Pendulum-v1", algo="sac", max_policy_lag=0)) is None  # no bound to drop by
    result = main_in_process(["--env", "CartPole-v1", "--max-policy-lag", "0", "--print-config"], tmp_path, capsys)
    assert result.returncode == 0
    (line,) = result.stderr.splitlines()
    assert line.startswith("asyncrl: warning: --max-policy-lag 0 with asynchronous workers drops every sample")


def test_a_toml_settings_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.toml"
    path.write_text('env = "CartPole-v1"\n')
    result = main_in_process(["--config", str(path)], tmp_path / "runs", capsys)
    line = assert_user_error(result, "settings files are YAML (.yaml, .yml) or JSON (.json), not .toml")
    assert "JSON:" not in line
