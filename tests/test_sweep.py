"""asyncrl-sweep: planning (directories, core sharing, explicit flags kept) and a real tiny CartPole sweep."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from asyncrl.cli import sweep as sweep_command
from asyncrl.sweep import SweepError, parse_sweep, plan
from tests import launcher

SWEEP = {"base": {"env": "CartPole-v1", "frames": 3000, "report-interval": 1}, "grid": {"lr": [0.001, 0.0003]},
         "seeds": [0, 1], "group": "lr_sweep"}


def sweep_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return launcher.run("sweep", list(args), cwd=cwd, timeout=timeout)


def sweep_in_process(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """`asyncrl-sweep ARGS` run from `cwd` as its main() in this process (for what trains nothing: its runs, if
    any, are still asyncrl-train subprocesses)."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = sweep_command.main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["asyncrl-sweep", *args], code, out.out, out.err)


def test_plan_shares_cores_and_keeps_explicit_flags() -> None:
    sweep = parse_sweep({**SWEEP, "base": {**SWEEP["base"], "train_dir": "/runs"}}, "unused")
    plans = plan(sweep, concurrent=2, cores=8)
    assert [p.run_dir for p in plans] == ["/runs/lr_sweep/lr-0.001/lr-0.001_seed0",
                                          "/runs/lr_sweep/lr-0.001/lr-0.001_seed1",
                                          "/runs/lr_sweep/lr-0.0003/lr-0.0003_seed0",
                                          "/runs/lr_sweep/lr-0.0003/lr-0.0003_seed1"]
    args = plans[0].args
    assert args[args.index("--workers") + 1] == "4" and args[args.index("--learner-threads") + 1] == "4"
    assert args[args.index("--lr") + 1] == "0.001" and args[args.index("--seed") + 1] == "0"
    crowded = plan(sweep, concurrent=16, cores=8)[0].args  # never fewer than one core
    assert crowded[crowded.index("--workers") + 1] == "1" and crowded[crowded.index("--learner-threads") + 1] == "1"
    explicit = parse_sweep({**SWEEP, "base": {**SWEEP["base"], "--workers": 3, "normalize_obs": False}}, "x")
    args = plan(explicit, concurrent=2, cores=8)[0].args
    assert args[args.index("--workers") + 1] == "3" and args.count("--workers") == 1
    assert args[args.index("--learner-threads") + 1] == "4" and "--no-normalize-obs" in args


@pytest.mark.parametrize("data, message", [
    ({"grid": {"seed": [1, 2]}}, "set by the sweep"),
    ({"base": {"no_such_flag": 1}}, "unknown flag"),
    ({"grid": {"lr": []}}, "non-empty list"),
    ({"seeds": "0"}, "list of integers"),
    ({"grdi": {}}, "unknown key"),
])
def test_bad_sweep_files_are_rejected(data: dict, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_sweep(data, "g")


def test_dry_run_prints_every_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sweep.yaml").write_text("base: {env: CartPole-v1, frames: 3000}\ngrid:\n  lr: [0.001, 0.0003]\n"
                                         "seeds: [0, 1, 2]\ngroup: g\n")
    result = sweep_in_process("sweep.yaml", "--dry-run", "--concurrent", "3", cwd=tmp_path, monkeypatch=monkeypatch,
                              capsys=capsys)
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("asyncrl-train ")]
    assert len(commands) == 6 and "--experiment lr-0.0003_seed2" in commands[-1]
    assert not (tmp_path / "train_dir").exists()


def test_bad_file_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.json").write_text('{"grid": {"lr": [0.001]}, "base": {"seed": 3}}')
    result = sweep_in_process("s.json", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("asyncrl-sweep: error: base: 'seed' is set by the sweep")


def test_failing_runs_are_reported_and_the_sweep_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's main() here; its two runs are asyncrl-train processes of their own, refused at validation."""
    (tmp_path / "s.json").write_text(json.dumps({"base": {"env": "CartPole-v1", "frames": 1000},
                                                 "grid": {"epochs": [0, -1]}, "group": "bad"}))
    result = sweep_in_process("s.json", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 2 and "--epochs must be at least 1" in failed[0]
    assert "0 of 2 runs finished, 2 failed" in result.stdout


def test_tiny_sweep_runs_every_point_and_compare_reads_it(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text(json.dumps(SWEEP))
    result = sweep_cli("sweep.json", "--concurrent", "2", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    group = tmp_path / "train_dir" / "lr_sweep"
    runs = sorted(p.parent.relative_to(group).as_posix() for p in group.glob("*/*/metrics.jsonl"))
    assert runs == ["lr-0.0003/lr-0.0003_seed0", "lr-0.0003/lr-0.0003_seed1",
                    "lr-0.001/lr-0.001_seed0", "lr-0.001/lr-0.001_seed1"]
    config = json.loads((group / "lr-0.001" / "lr-0.001_seed1" / "config.json").read_text())
    assert config["seed"] == 1 and config["lr"] == 0.001
    compare = launcher.run("compare", [str(group / "lr-0.001"), str(group / "lr-0.0003"), "--out",
                                       str(tmp_path / "cmp")], timeout=120)
    assert compare.returncode == 0, compare.stderr
    assert "lr-0.001 " in compare.stdout and (tmp_path / "cmp" / "curves.png").exists()
