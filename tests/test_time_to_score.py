"""scripts/time_to_score.py: each system's log parser on small snippets of its format, and bad input exits 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "time_to_score.py"


@pytest.fixture(scope="module")
def tts():
    spec = importlib.util.spec_from_file_location("time_to_score", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["time_to_score"] = module
    spec.loader.exec_module(module)
    return module


def test_asyncrl_metrics(tts) -> None:
    lines = [json.dumps({"frames": 40960, "time": 12.5, "episode_return_mean": -20.5, "fps": 3000}),
             json.dumps({"frames": 81920, "time": 25.0, "episode_return_mean": None}),
             "not json",
             json.dumps({"frames": 122880, "time": 37.5, "episode_return_mean": 18.25}),
             json.dumps({"frames": 163840, "time": 50.0, "episode_return_mean": 19.0, "episodes": 99}),
             json.dumps({"frames": 204800, "time": 62.5, "episode_return_mean": 19.5, "episodes": 100})]
    points = tts.parse_asyncrl(lines)  # a record that says fewer than 100 games ended is no 100-game mean
    assert points == [(40960, 12.5, -20.5), (122880, 37.5, 18.25), (204800, 62.5, 19.5)]
    assert tts.first_reach(points, 18.0) == (122880, 37.5)
    assert tts.first_reach(points, 20.0) is None


def test_sf2_log(tts) -> None:
    lag = ". Throughput: 0: 1638.4. Samples: 8192. Policy #0 lag: (min: 0.0, avg: 0.0, max: 0.0)"
    fps = "Fps is (10 sec: 1638.4, 60 sec: 1638.4, 300 sec: 1638.4). Total num frames: "
    log = [f"[2026-12-06 23:50:01,000][01234] Fps is (10 sec: nan, 60 sec: nan). Total num frames: 0{lag}",
           f"[2026-12-06 23:50:06,000][01234] {fps}8192{lag}",
           "[2026-12-06 23:50:06,001][01234] Avg episode reward: [(0, '-20.667')]",
           f"[2026-12-06 23:50:11,500][01234] {fps}16384{lag}",
           "[2026-12-06 23:50:11,501][01234] Avg episode reward: [(0, '20.100')]"]
    points = tts.parse_sf2(log)
    assert [(f, r) for f, _, r in points] == [(8192, -20.667), (16384, 20.1)]
    assert points[0][1] == pytest.approx(5.001) and points[1][1] == pytest.approx(10.501)


def test_cleanrl_stdout(tts) -> None:
    lines = ["[+3.100] SPS: 100", *(f"[+{i}.0] global_step={i}, episodic_return=[-21.]" for i in range(1, 99)),
             "[+100.500] global_step=1000, episodic_return=[-19.]",
             "[+110.250] global_step=2000, episodic_return=[-1.]",
             "[+120.000] global_step=3000, episodic_return=-20.0"]
    points = tts.parse_cleanrl(lines)  # from the 100th game on, each game's point holds the mean of the last 100
    assert points == [(8000, 110.25, (98 * -21 - 19 - 1) / 100), (12000, 120.0, (97 * -21 - 19 - 1 - 20) / 100)]


def test_cleanrl_window_is_100_games(tts) -> None:
    lines = [f"[+{i}.0] global_step={i}, episodic_return=[{-21 if i < 100 else 21}]" for i in range(200)]
    assert tts.parse_cleanrl(lines)[-1][2] == 21.0


@pytest.mark.parametrize("argv", [["--frames", "1e6", "--out", "{tmp}", "--systems", "rllib"],
                                  ["--frames", "10", "--out", "{tmp}"],
                                  ["--frames", "1e6", "--out", "{tmp}", "--sf2-python", "/nonexistent/python"],
                                  ["--frames", "lots", "--out", "{tmp}"]])
def test_bad_input_exits_2(tmp_path: Path, argv: list[str]) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), *[a.format(tmp=tmp_path) for a in argv]],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_documented_command_flags_exist() -> None:
    """docs/results.md's command (in a text block, which the doc-recipe tests do not run) names only real flags."""
    doc = (SCRIPT.parent.parent / "docs" / "results.md").read_text()
    start = doc.index(".venv/bin/python scripts/time_to_score.py")
    command = doc[start:doc.index("```", start)]
    help_text = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    flags = [w for w in command.split() if w.startswith("--")]
    assert flags and all(f in help_text for f in flags), flags


def test_sf2_log_over_two_sittings(tts) -> None:
    """A resumed Sample Factory run: seconds are running time (the pause is left out) and the frames it did again
    after going back to its checkpoint replace the first go's."""
    fps = "Fps is (10 sec: 1638.4, 60 sec: 1638.4, 300 sec: 1638.4). Total num frames: "
    log = [f"[2026-12-06 10:00:10,000][01234] {fps}8192",
           "[2026-12-06 10:00:10,001][01234] Avg episode reward: [(0, '-20.000')]",
           f"[2026-12-06 10:00:50,000][01234] {fps}16384",
           "[2026-12-06 10:00:50,001][01234] Avg episode reward: [(0, '-19.000')]",
           f"[2026-12-06 12:00:20,000][05678] {fps}12288",  # resumed from a checkpoint at 12,288 frames
           "[2026-12-06 12:00:20,001][05678] Avg episode reward: [(0, '-18.000')]"]
    stamp = tts.datetime.strptime
    first = stamp("2026-12-06 10:00:00", "%Y-%m-%d %H:%M:%S").timestamp()
    second = stamp("2026-12-06 12:00:00", "%Y-%m-%d %H:%M:%S").timestamp()
    points = tts.parse_sf2(log, [{"started": first, "wall_s": 60.0}, {"started": second, "wall_s": 30.0}])
    assert [(f, r) for f, _, r in points] == [(8192, -20.0), (12288, -18.0)]
    assert points[0][1] == pytest.approx(10.001) and points[1][1] == pytest.approx(80.001)


def test_resume_refuses_an_unfinished_cleanrl_run(tmp_path: Path) -> None:
    (tmp_path / "cleanrl").mkdir()
    (tmp_path / "cleanrl" / "run.json").write_text(json.dumps(
        {"command": [], "started": 0.0, "wall_s": 5.0, "returncode": -2, "timed_out": True}))
    script = tmp_path / "ppo_atari.py"
    script.write_text("")
    result = subprocess.run([sys.executable, str(SCRIPT), "--frames", "20000", "--out", str(tmp_path), "--resume",
                             "--systems", "cleanrl", "--cleanrl-python", sys.executable, "--cleanrl-script",
                             str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cannot continue a run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


PEERS = SCRIPT.with_name("peer_venvs.py")


def test_peer_venvs_dry_run_prints_each_step_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "peers"
    result = subprocess.run([sys.executable, str(PEERS), str(out), "--dry-run", "--torch-spec", "torch==2.13.0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert any("sample-factory==2.1.1" in s and "vizdoom" in s for s in steps)
    assert sum(s.endswith("install -q torch==2.13.0") for s in steps) == 2  # torch first, in each venv
    assert any(s.startswith("+ git clone") for s in steps) and any("archive fe8d8a0" in s for s in steps)
    assert f"--cleanrl-script {out}/cleanrl_src/cleanrl/ppo_atari.py" in result.stdout
    assert not out.exists()


def test_peer_venvs_refuses_a_folder_without_cleanrls_commit(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(PEERS), str(tmp_path / "peers"), "--cleanrl-src", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "has no commit" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "peers").exists()


def test_sf2_points_wait_for_100_games_in_each_sitting(tts, tmp_path: Path) -> None:
    """Sample Factory's mean restarts at a resume: a sitting's points count from the frames at which its tensorboard
    file first holds `reward/reward` (written once 100 games are in its deque), read from the files themselves."""
    from torch.utils.tensorboard import SummaryWriter

    stamp = tts.datetime.strptime
    first = stamp("2026-12-06 10:00:00", "%Y-%m-%d %H:%M:%S").timestamp()
    second = stamp("2026-12-06 12:00:00", "%Y-%m-%d %H:%M:%S").timestamp()
    for started, full_at in ((first, 8192), (second, 20480)):
        writer = SummaryWriter(str(tmp_path / "pong" / ".summary" / "0"), filename_suffix=f".{int(started)}")
        writer.add_scalar("perf/_fps", 1000.0, full_at - 4096, walltime=started + 5)
        writer.add_scalar("reward/reward", -19.0, full_at, walltime=started + 20)
        writer.add_scalar("reward/reward", -18.0, full_at + 4096, walltime=started + 25)
        writer.close()
    full = tts.sf2_window_full(tmp_path)
    assert sorted(f for _, f in full) == [8192, 20480]
    fps = "Fps is (10 sec: 1638.4, 60 sec: 1638.4, 300 sec: 1638.4). Total num frames: "
    log = [f"[2026-12-06 10:00:05,000][01234] {fps}4096",
           "[2026-12-06 10:00:05,001][01234] Avg episode reward: [(0, '-21.000')]",  # fewer than 100 games
           f"[2026-12-06 10:00:20,000][01234] {fps}8192",
           "[2026-12-06 10:00:20,001][01234] Avg episode reward: [(0, '-19.000')]",
           f"[2026-12-06 12:00:10,000][05678] {fps}16384",  # resumed: its mean starts again
           "[2026-12-06 12:00:10,001][05678] Avg episode reward: [(0, '21.000')]",
           f"[2026-12-06 12:00:20,000][05678] {fps}20480",
           "[2026-12-06 12:00:20,001][05678] Avg episode reward: [(0, '-18.500')]"]
    segments = [{"started": first, "wall_s": 60.0}, {"started": second, "wall_s": 30.0}]
    points = tts.parse_sf2(log, segments, full)
    assert [(f, r) for f, _, r in points] == [(8192, -19.0), (20480, -18.5)]
    assert tts.first_reach(points, 20.0) is None  # the resumed sitting's first game alone read 21


def test_the_plot_breaks_curves_at_a_gap(tts) -> None:
    points = [(f, f / 1000, -20.0) for f in range(0, 40960, 4096)]
    points += [(1_000_000, 900.0, 15.0), (1_004_096, 905.0, 15.5)]
    runs = tts.unbroken(points)
    assert [len(r) for r in runs] == [10, 2] and runs[1][0][0] == 1_000_000
    assert tts.unbroken([]) == [] and len(tts.unbroken(points[:1])) == 1
