"""scripts/check_readme_cartpole.py checks README's first claim by running exactly the command README shows.

The check itself (10 seeds, 7-8 minutes on 2 cores shared with other jobs) is run by a reviewer; here, cheaply:
the script reads the command and the figure from README's "A first run" block, and runs that command with only
the seed and where it writes added."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from tests.doc_commands import ROOT, find

spec = importlib.util.spec_from_file_location("check_readme_cartpole", ROOT / "scripts" / "check_readme_cartpole.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_the_script_reads_the_command_and_figure_readme_shows() -> None:
    argv, target = check.readme_claim()
    shown = find("README.md", "asyncrl-train --env CartPole-v1 --frames")  # README's first run, comment dropped
    assert argv == list(shown.words)
    assert target == 475
    first_run = (ROOT / "README.md").read_text().split("## A first run")[1].split("\n## ")[0]
    assert f"{' '.join(argv)}" in first_run and "reaches 475" in first_run


def test_each_seed_runs_the_readme_command_with_only_seed_and_place_added(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    argv, target = check.readme_claim()
    ran = []

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    result = check.run_seed(argv, 3, tmp_path, target)
    (cmd,) = ran
    assert Path(cmd[0]).name == "asyncrl-train"
    assert cmd[1:] == [*argv[1:], "--seed", "3", "--train-dir", str(tmp_path), "--experiment", "seed_3"]
    assert result["steps_to_target"] is None  # no metrics: not passed


def test_a_seed_is_judged_by_its_best_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv, target = check.readme_claim()

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        run = tmp_path / "seed_0"
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"time": 6.0, "env_steps": 150000, "episode_return_mean": 480.5}\n'
                                           '{"time": 9.0, "env_steps": 300000, "episode_return_mean": 470.0}\n')
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    result = check.run_seed(argv, 0, tmp_path, target)
    assert (result["best"], result["final"], result["steps_to_target"]) == (480.5, 470.0, 150000)
