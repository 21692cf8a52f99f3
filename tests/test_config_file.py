"""--config FILE (YAML or JSON) and --print-config: file over presets, command line over file, strict keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli.train import main
from asyncrl.config import ConfigError
from asyncrl.resolve import config_from_flags
from tests.conftest import run_cli
from tests.train_cli import main_in_process


def resolved(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """The configuration `asyncrl-train ARGS --print-config` prints."""
    assert main([*args, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_and_yaml_files_set_flags_over_the_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps({"env": "CartPole-v1", "batch-size": 4096, "lr": 0.002, "normalize_obs": True}))
    as_yaml = tmp_path / "run.yaml"
    as_yaml.write_text("env: CartPole-v1\nbatch_size: 4096\nlr: 2e-3\nnormalize-obs: true\n")  # YAML's 2e-3: a str
    preset = resolved(capsys, "--env", "CartPole-v1")
    for path in (as_json, as_yaml):
        cfg = resolved(capsys, "--config", str(path))
        assert (cfg["env"], cfg["batch_size"], cfg["lr"], cfg["normalize_obs"]) == ("CartPole-v1", 4096, 0.002, True)
        assert cfg["epochs"] == preset["epochs"] == 6  # what the file leaves out still comes from the preset
        assert cfg == {**preset, "batch_size": 4096, "lr": 0.002, "normalize_obs": True}


def test_the_command_line_wins_over_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("env: CartPole-v1\nbatch-size: 4096\nseed: 3\nnormalize-obs: true\n")
    cfg = resolved(capsys, "--config", str(path), "--batch-size", "1024", "--no-normalize-obs", "--seed", "0")
    assert (cfg["batch_size"], cfg["normalize_obs"], cfg["seed"]) == (1024, False, 0)  # even a default's value
    assert config_from_flags(str(path), batch_size=1024).batch_size == 1024  # the Python API: keyword flags win


@pytest.mark.parametrize("text, message", [
    ('{"env": "CartPole-v1", "batch_sise": 64}', "unknown setting 'batch_sise' (did you mean batch_size?)"),
    ('{"workers": "4"}', "workers must be an integer, not '4'"),
    ('{"normalize_obs": 1}', "normalize_obs must be true or false, not 1"),
    ('{"lr": "fast"}', "lr must be a number, not 'fast'"),
    ('["env", "CartPole-v1"]', "must hold a mapping of flag names to values, not a list"),
    ('{"env": ', "is not valid JSON"),
])
def test_bad_files_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                       message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert main(["--config", str(path), "--train-dir", str(tmp_path / "train")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncrl-train: error: --config {path}") and message in err
    assert err.count("\n") == 1 and not (tmp_path / "train").exists()


def test_unknown_key_exits_2_from_the_console_script(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("env: CartPole-v1\nbogus: 1\n")
    result = run_cli(["--config", str(path)], tmp_path / "train")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"asyncrl-train: error: --config {path}: unknown setting 'bogus' (keys are "
                                          f"asyncrl-train's flags, e.g. batch_size)"]
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        config_from_flags(str(path))


def test_print_config_prints_and_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_dir = tmp_path / "train"
    result = main_in_process(["--env", "CartPole-v1", "--frames", "5000", "--print-config"], train_dir, capsys)
    assert result.returncode == 0, result.stderr
    cfg = json.loads(result.stdout)
    assert (cfg["env"], cfg["frames"], cfg["train_dir"], cfg["lr_schedule"]) == (
        "CartPole-v1", 5000, str(train_dir), "linear")  # resolved: the preset's auto schedule with --frames
    assert not train_dir.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    bad = main_in_process(["--env", "CartPole-v1", "--batch-size", "100", "--print-config"], train_dir, capsys)
    assert bad.returncode == 2 and "must be a multiple" in bad.stderr and bad.stdout == ""  # validated first
