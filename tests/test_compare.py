"""asyncrl-compare on hand-written run groups with known answers (statistics checked against scipy directly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from asyncrl.cli.compare import main as compare_main
from asyncrl.diagnostics.compare import FINAL_RECORDS


def write_run(run_dir: Path, curve: list[tuple[int, float | None]]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    lines = [json.dumps({"time": i, "frames": f, "episode_return_mean": v}) for i, (f, v) in enumerate(curve)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def write_group(root: Path, name: str, finals: list[float], ramp_to: int = 10_000) -> Path:
    """One run per final value: the metric climbs linearly from 0 to `final` over `ramp_to` frames and then
    stays there for FINAL_RECORDS records (so the run's final score is exactly `final`)."""
    group = root / name
    for seed, final in enumerate(finals):
        curve: list[tuple[int, float | None]] = [(0, None)]  # a record before any episode ended: skipped
        curve += [(f, final * f / ramp_to) for f in range(1000, ramp_to, 1000)]
        curve += [(ramp_to + 1000 * k, final) for k in range(FINAL_RECORDS)]
        write_run(group / f"seed{seed}", curve)
    return group


def run_compare(capsys, *args: str) -> tuple[int, str, str]:
    code = compare_main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_statistics_match_scipy_and_outputs_are_written(tmp_path: Path, capsys) -> None:
    a_finals = [10.0, 20.0, 30.0, 40.0, 55.0, 200.0]
    b_finals = [5.0, 12.0, 18.0, 33.0]
    a = write_group(tmp_path, "a", a_finals)
    b = write_group(tmp_path, "b", b_finals)
    out = tmp_path / "out"
    code, stdout, _ = run_compare(capsys, str(a), str(b), "--out", str(out), "--threshold", "15")
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    ga, gb = summary["groups"]
    assert ga["iqm"] == pytest.approx(stats.trim_mean(a_finals, 0.25))
    assert gb["iqm"] == pytest.approx(stats.trim_mean(b_finals, 0.25))
    assert ga["iqm_ci"][0] <= ga["iqm"] <= ga["iqm_ci"][1]
    pair = summary["pairs"][0]
    assert pair["welch_p"] == pytest.approx(stats.ttest_ind(a_finals, b_finals, equal_var=False).pvalue)
    assert pair["mannwhitney_p"] == pytest.approx(stats.mannwhitneyu(a_finals, b_finals).pvalue)
    wins = sum((x > y) + 0.5 * (x == y) for x in a_finals for y in b_finals) / (len(a_finals) * len(b_finals))
    assert pair["probability_of_improvement"] == pytest.approx(wins)
    # the ramp final * frames / 10000 first reaches 15 at 9000 frames for final 18 and 5000 for 33
    expected = {"seed0": None, "seed1": None, "seed2": 9000, "seed3": 5000}
    assert gb["frames_to_threshold"] == expected
    assert "b/seed0: not reached" in stdout and "b/seed2: 9,000" in stdout
    png = (out / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert f"{stats.trim_mean(a_finals, 0.25):.3f}" in stdout


def test_probability_of_improvement_separated_and_identical(tmp_path: Path, capsys) -> None:
    high = write_group(tmp_path, "high", [100.0, 110.0, 120.0])
    low = write_group(tmp_path, "low", [1.0, 2.0, 3.0])
    same = write_group(tmp_path / "copy", "high", [100.0, 110.0, 120.0])
    code, stdout, _ = run_compare(capsys, str(high), str(low), str(same), "--out", str(tmp_path / "o"))
    assert code == 0
    pairs = json.loads((tmp_path / "o" / "summary.json").read_text())["pairs"]
    assert pairs[0]["probability_of_improvement"] == 1.0  # high vs low
    assert pairs[1]["probability_of_improvement"] == 0.5  # high vs its identical copy
    assert pairs[2]["probability_of_improvement"] == 0.0  # low vs high
    assert "P(A>B)" in stdout


@pytest.mark.parametrize("make", ["missing", "empty", "no_metric"])
def test_bad_groups_are_one_line_errors_with_exit_2(tmp_path: Path, capsys, make: str) -> None:
    good = write_group(tmp_path, "good", [1.0, 2.0])
    bad = tmp_path / "bad"
    if make == "empty":
        bad.mkdir()
    elif make == "no_metric":
        write_run(bad / "seed0", [(1000, None), (2000, None)])
    code, stdout, stderr = run_compare(capsys, str(good), str(bad))
    assert code == 2
    assert stderr.startswith("asyncrl-compare: error: ") and stderr.count("\n") == 1
    assert str(bad) in stderr and stdout == ""


def test_constant_groups_give_an_undefined_welch_p_as_null(tmp_path: Path, capsys) -> None:
    a = write_group(tmp_path, "a", [7.0, 7.0, 7.0])
    b = write_group(tmp_path / "other", "a", [7.0, 7.0])
    code, stdout, _ = run_compare(capsys, str(a), str(b), "--out", str(tmp_path / "o"))
    assert code == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["groups"][0]["iqm"] == 7.0 and summary["groups"][0]["iqm_ci"] == [7.0, 7.0]
    assert summary["pairs"][0]["probability_of_improvement"] == 0.5
    assert summary["pairs"][0]["welch_p"] is None  # no variance: scipy gives nan, strict JSON needs null
    assert summary["pairs"][0]["mannwhitney_p"] == stats.mannwhitneyu([7.0] * 3, [7.0] * 2).pvalue


def test_at_frames_compares_runs_as_they_stood_then(tmp_path: Path, capsys) -> None:
    """Runs of different lengths: --at-frames scores each on its records up to F, and refuses a run that
    stopped before F."""
    a = write_group(tmp_path, "a", [10.0, 20.0], ramp_to=10_000)  # records up to 14,000 frames
    long_run = [(f, 100.0 * f / 20_000) for f in range(1000, 40_000, 1000)]  # still climbing at 14,000
    write_run(a / "seed2", long_run)
    out = tmp_path / "out"
    code, stdout, _ = run_compare(capsys, str(a), "--at-frames", "14000", "--out", str(out))
    assert code == 0, stdout
    summary = json.loads((out / "summary.json").read_text())
    finals = summary["groups"][0]["finals"]
    # the long run's last five records at or before 14,000 frames: 10,000..14,000, i.e. 50..70, mean 60
    assert finals == {"seed0": 10.0, "seed1": 20.0, "seed2": pytest.approx(60.0)}
    assert summary["at_frames"] == 14000 and "at or before 14,000 frames" in stdout
    code, _, err = run_compare(capsys, str(a), "--at-frames", "20000")
    assert code == 2 and "stopped at 14,000 frames, before --at-frames 20,000" in err and len(err.splitlines()) == 1


def test_frames_to_threshold_waits_for_a_full_window_of_episodes(tmp_path: Path, capsys) -> None:
    """A few lucky first episodes put the rolling mean over the threshold: that is not the run reaching it."""
    run_dir = tmp_path / "g" / "seed0"
    run_dir.mkdir(parents=True)
    records = [(8_000, 0.98, 4), (50_000, 0.02, 60), (100_000, 0.97, 99), (150_000, 0.4, 150), (200_000, 0.96, 400)]
    lines = [json.dumps({"time": i, "frames": f, "episode_return_mean": v, "episodes": e})
             for i, (f, v, e) in enumerate(records)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, stdout, _ = run_compare(capsys, str(tmp_path / "g"), "--threshold", "0.95", "--out", str(tmp_path / "o"))
    assert code == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["groups"][0]["frames_to_threshold"] == {"seed0": 200_000}
    assert "g/seed0: 200,000" in stdout


def test_window_compares_the_mean_return_of_recent_episodes(tmp_path: Path) -> None:
    """`asyncrl-compare --window STEPS` (the real command): each record's episode_return_window recovered from the
    running means, here 10 then 20 (the 2 episodes of the last 50 env steps), so each run's final score is 15."""
    for seed in range(2):
        run_dir = tmp_path / "group" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        records = [{"time": 1, "frames": 100, "env_steps": 100, "episodes": 2, "episode_return_mean": 10.0},
                   {"time": 2, "frames": 200, "env_steps": 200, "episodes": 4, "episode_return_mean": 15.0}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    command = [sys.executable, "-m", "asyncrl.cli.compare", str(tmp_path / "group"), "--window", "50",
               "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["metric"] == "episode_return_window"
    assert summary["groups"][0]["finals"] == {"seed0": 15.0, "seed1": 15.0}, summary["groups"][0]
    refused = subprocess.run([*command[:-2], "--metric", "episode_return_mean"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "drop --metric" in refused.stderr
