"""asyncrl-tune and the live dashboard: the tuner leaves a deliberately bad start layout for a faster one and writes
it as a --config file that asyncrl-train runs; on a terminal that run shows the dashboard, not the progress line."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import sys
import time
from pathlib import Path

import yaml

from asyncrl.config import Config
from asyncrl.diagnostics.dashboard import Dashboard, sparkline, wanted
from asyncrl.diagnostics.layout_moves import suggestion
from asyncrl.resolve import config_from_flags
from asyncrl.tune.measure import summarize
from tests import launcher
from tests.conftest import read_metrics

ROW = re.compile(r"^\s+(\d+)\s+(\d+w x \d+e/\d+s .*?)\s+([\d,]+)\s+\S+\s{2}")
PROGRESS_LINE = re.compile(r"^\[\s*\d+s\] frames", re.MULTILINE)


def in_a_terminal(args: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """`asyncrl-train ARGS` (a fork of the warm interpreter, `tests/launcher.py`) with stdout and stderr on a
    pseudo-terminal (140 x 50); its exit code and output."""
    master, slave = pty.openpty()
    terminal = Path(os.ttyname(slave))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "50"}
    # The command opens the terminal by name as its stdout and stderr; this end stays open until it has ended, so
    # the terminal never closes under it.
    proc = launcher.popen("train", args, terminal, terminal, env=env, start_new_session=True)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:  # ended, and all it wrote has been read
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        os.close(slave)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return code, b"".join(chunks).decode(errors="replace")


def test_the_tuner_beats_a_bad_start_and_its_config_runs_with_the_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "tuned.yaml"
    bad = ["--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "2"]  # one env per request: slow
    done = launcher.run("tune", [*bad, "--seconds-per-layout", "3", "--max-layouts", "2", "--no-confirm",
                                 "--budget", "90", "--out", str(out)], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "at most 90 s in all" in done.stdout and "usable core" in done.stdout  # its limit, said first
    rows = {int(m.group(1)): (m.group(2), float(m.group(3).replace(",", "")))
            for m in map(ROW.match, done.stdout.splitlines()) if m}
    assert rows[1][0].startswith("1w x 2e/2s"), done.stdout  # the start, as given
    assert rows[2][1] > 2 * rows[1][1], done.stdout  # the layout its verdict led to: much faster
    settings = yaml.safe_load(out.read_text())
    assert settings["env"] == "CartPole-v1" and settings["envs_per_worker"] == 64, settings
    assert "winner #2" in out.read_text()  # the table is in the file, as comments

    # The file runs as asyncrl-train --config, on a terminal: the dashboard instead of the progress line.
    code, screen = in_a_terminal(["--config", str(out), "--seconds", "2", "--report-interval", "0.5",
                                  "--train-dir", str(tmp_path / "td"), "--experiment", "tuned"])
    assert code == 0, screen
    for part in ("steps/s", "frames/s", "time share per stage", "bottleneck:", "data in flight", "full queue",
                 "learner", "return", "this screen:", "final checkpoint"):
        assert part in screen, (part, screen[-3000:])
    assert not PROGRESS_LINE.search(screen), screen[-3000:]
    tuned = summarize(read_metrics(tmp_path / "td" / "tuned"))
    assert tuned.sps > rows[1][1], (tuned, rows)  # faster than the bad start here too


def test_the_dashboard_draws_a_record_and_says_what_to_change() -> None:
    """One record with every field, drawn on a recording console; --no-dashboard and a non-terminal turn it off."""
    cfg = config_from_flags(env="CartPole-v1", seconds=60)
    assert not wanted(cfg, io.StringIO()) and not wanted(Config(dashboard=False), sys.__stdout__)
    record = {"time": 12.0, "frames": 90_000, "env_steps": 90_000, "fps": 8000.0, "sps": 8000.0, "episodes": 300,
              "episode_return_mean": 120.5, "episode_len_mean": 120.5, "policy_version": 40, "dropped_stale": 0,
              "learner_updates": 5, "policy_loss": 0.01, "value_loss": 3.2, "entropy": 0.6, "kl": 0.004,
              "grad_norm": 0.8, "policy_lag_mean": 1.4, "policy_lag_max": 3, "policy_lag_limit": 4,
              "rollout_env_frac": 0.1, "policy_infer_frac": 0.2, "learner_train_frac": 0.95,
              "learner_wait_frac": 0.03, "queue_requests": 1.0, "queue_full": 4.0, "queue_free": 0.0,
              "procs": {"runner": {"rss_mb": 250.0, "cpu": 1.0}, "learner": {"rss_mb": 200.0, "cpu": 95.0},
                        "rollout-0": {"rss_mb": 90.0, "cpu": 20.0}, "rollout-1": {"rss_mb": 90.0, "cpu": 20.0}},
              "cpu_total": 136.0, "cpu_system": 70.0, "dropped_share": 0.0, "bottleneck": "training",
              "bottleneck_reason": "learner trains 95% of the time and never waits for data"}
    from rich.console import Console

    console = Console(record=True, width=140, file=io.StringIO(), force_terminal=True)
    board = Dashboard(cfg, cores=2)
    board.update(record, 12.0)
    board.update({**record, "time": 13.0, "sps": 9000.0, "episode_return_mean": 150.0}, 13.0)
    console.print(board.render())
    text = console.export_text()
    for part in ("9,000 steps/s", "training (learner)", "95%", "training-bound", "mean 1.4 max 3 of 4",
                 "rollout x2", "value_loss", "entropy", "grad_norm", "return 150", "ETA",
                 "do this: the learner is the bottleneck: try --minibatches 1"):
        assert part in text, (part, text)
    assert sparkline([1, 2, 3]) == "▁▅█"
    # dropping samples: the tuner's first move is fewer envs in flight
    assert suggestion(cfg, {**record, "bottleneck": "env", "dropped_share": 0.2}, 2).startswith(
        "20% of the samples are dropped: try --envs-per-worker 32")
    assert suggestion(cfg, {**record, "bottleneck": "env"}, 2) is None  # nothing to act on
    assert json.dumps(record)  # the record is a plain metrics record


def test_the_tuner_refuses_the_flags_it_sets_itself(capsys) -> None:
    from asyncrl.cli.tune import main

    for flags in (["--seconds", "5"], ["--train-dir", "x"], ["--serial"]):  # not taken for --seconds-per-layout
        assert main(["--env", "CartPole-v1", *flags]) == 2
        assert f"{flags[0]} is not for asyncrl-tune" in capsys.readouterr().err
