"""The command line means what it says: no abbreviations, presets shown in --help, one safe experiment name.

Each case calls `asyncrl-train`'s `main(argv)` in this process (tests/test_cli.py runs the console script itself).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train_cli import FAST, assert_user_error, main_in_process


@pytest.mark.parametrize("flags", [["--gam", "0.99"], ["--entropy", "0.0"], ["--lr-sched", "constant"],
                                   ["--norm"]])
def test_abbreviated_flags_are_refused(tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    train_dir = tmp_path / "runs"
    result = main_in_process([*FAST, *flags], train_dir, capsys)
    assert_user_error(result, "unrecognized arguments", flags[0])
    assert not train_dir.exists()


def test_help_shows_default_and_preset_value(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    result = main_in_process(["--help"], tmp_path, capsys)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps to the terminal width
    assert ("--lr LR Adam learning rate (default: 0.00025; vector preset: 0.001; vector_continuous preset: 0.001; "
            "vector_batched preset: 0.0028; gymnax_minatar preset: 0.0005; mujoco preset: 0.0003; off_policy preset: "
            "0.0003)") in text
    assert ("--gamma GAMMA discount factor (default: 0.99; vector preset: 0.98; vector_continuous preset: 0.98; "
            "gymnax_minatar preset: 0.999)") in text  # vector_batched: 0.99
    assert ("--entropy-coeff ENTROPY_COEFF entropy bonus weight (default: 0.01; vector preset: 0.0; vector_continuous "
            "preset: 0.0; vector_batched preset: 0.0; mujoco preset: 0.0; --algo appo only)") in text
    assert ("--clip-ratio CLIP_RATIO PPO clip epsilon (default: 0.1; gymnax_minatar preset: 0.2; mujoco preset: 0.2; "
            "--algo appo only)") in text
    assert "--adam-eps ADAM_EPS Adam epsilon (default: 1e-05; --algo appo only) " in text  # no preset changes it


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs", "..", "a..b", ".", "   ", ""])
def test_experiment_must_be_one_directory_name(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    train_dir = tmp_path / "runs"
    result = main_in_process([*FAST, "--experiment", name], train_dir, capsys)
    assert_user_error(result, "--experiment")
    assert not train_dir.exists() and not (tmp_path / "escape").exists()
