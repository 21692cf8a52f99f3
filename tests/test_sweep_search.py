"""asyncrl-sweep's search mode: bad files refused before anything starts, a real pruned search, a search stopped
with SIGINT and resumed, a killed search's trials asked again."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.resolve import read_config_file
from asyncrl.search.spec import parse_search
from asyncrl.search.study import open_study, recover_stale
from asyncrl.sweep import SweepError
from tests import launcher
from tests.test_sweep import sweep_in_process

REPO = Path(__file__).resolve().parents[1]

SEARCH = {"base": {"env": "CartPole-v1", "frames": 6000, "report-interval": 0.1},
          "search": {"lr": {"log": [1.0e-4, 1.0e-2]}}, "objective": {"metric": "episode_return_mean"},
          "trials": 2, "seeds": [0], "group": "s", "pruner": "none"}
# The searches that stop a running trial (a pruner's or a Ctrl-C's SIGINT) train CartPole whose steps sleep 2 ms
# (tests/faults.py): plain CartPole passes 2,000 frames in a tenth of a second, so a trial ran out its 6,000-frame
# budget before the SIGINT came, now and then on a loaded machine (a pruned trial stopped at 6,094 frames; a Ctrl-C'd
# one COMPLETE). Such a trial (2 workers x 8 envs) makes about 1,000 env steps a second: a budget of 4,000 frames
# leaves two seconds or more after the rungs a pruner stops trials at (1,000 in the runs seen, the SIGINT landing
# ~500 frames later; 2,000 at most), and a record every 0.25 s is one every ~250 frames.
SLOW_BASE = {**SEARCH["base"], "env": "tests.faults:make_slow_cartpole", "frames": 4000, "report-interval": 0.25}


def with_tests_importable() -> dict[str, str]:
    """The environment for a search whose trials' env is in tests/ (the trials inherit it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("change, message", [
    ({"search": {"lr": {"uniform": [0.01, 0.001]}}}, "low 0.01 is above high 0.001"),
    ({"search": {"lr": {"log": [0, 0.01]}}}, "a log range must lie above 0"),
    ({"objective": {"metric": "episode_retrun_mean"}}, "unknown metric 'episode_retrun_mean'; did you mean"),
    ({"search": {"epochs": {"uniform": [1, 4]}}}, "takes whole numbers"),
    ({"search": {"frames": {"int": [1, 4]}}}, "each trial's budget"),
    ({"search": {"lr": [0.1, 0.2]}}, "a range is one of"),
    ({"sampler": "cmaes"}, "sampler: one of"),
    ({"sampler": {"type": "random", "startup": 3}}, "startup is for tpe and gp"),
    ({"trials": 0}, "at least 1"),
])
def test_bad_search_files_are_refused(change: dict, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        parse_search({**SEARCH, **change}, "g")


def test_bad_search_is_one_line_exit_2_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.json").write_text(json.dumps({**SEARCH, "search": {"lr": {"log": [1e-2, 1e-4]}}}))
    result = sweep_in_process("s.json", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "low 0.01 is above high" in result.stderr
    (tmp_path / "ok.json").write_text(json.dumps(SEARCH))
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    result = sweep_in_process("ok.json", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "pip install -e '.[sweep]'" in result.stderr
    assert not (tmp_path / "train_dir").exists()


def test_search_prunes_a_trial_and_writes_its_results(tmp_path: Path) -> None:
    """The objective is the run's learning rate (--lr, decayed: deterministic), so the random sampler's second trial
    (lr 1.1e-4 after 7.4e-4 with seed 2) is pruned at the first rung it reports, stopped by SIGINT before its
    budget."""
    search = {**SEARCH, "base": {**SLOW_BASE, "batch-size": 512},  # the first update, and learning_rate, early
              "objective": {"metric": "learning_rate", "last": 1}, "sampler": "random", "sampler_seed": 2,
              "pruner": {"type": "halving", "every": 500, "min_frames": 500, "reduction": 2}}
    (tmp_path / "s.json").write_text(json.dumps(search))
    result = launcher.run("sweep", ["s.json"], cwd=tmp_path, env=with_tests_importable(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    group = tmp_path / "train_dir" / "s"
    summary = json.loads((group / "summary.json").read_text())
    assert summary["trials"] == {"complete": 1, "pruned": 1}, result.stdout
    pruned = json.loads((group / "trial-0001" / "trial-0001_seed0" / "stopped.json").read_text())
    assert pruned["frames"] < SLOW_BASE["frames"]  # stopped by the pruner, cleanly (the stop record is written)
    assert "| pruned at " in (group / "trials.md").read_text()
    best = read_config_file(str(group / "best.yaml"))  # what asyncrl-train --config reads
    assert best["lr"] == pytest.approx(summary["best"]["params"]["lr"]) and best["frames"] == SLOW_BASE["frames"]
    assert (group / "history.png").stat().st_size > 0


def test_search_stopped_by_sigint_resumes_without_running_a_trial_twice(tmp_path: Path) -> None:
    # the run records at once: it has begun
    (tmp_path / "s.json").write_text(json.dumps({**SEARCH, "base": SLOW_BASE, "trials": 1}))
    group = tmp_path / "train_dir" / "s"
    env = with_tests_importable()
    with open(tmp_path / "out", "w"), open(tmp_path / "err", "w"):
        proc = launcher.popen("sweep", ["s.json"], tmp_path / "out", tmp_path / "err", cwd=tmp_path, env=env)
    metrics = group / "trial-0000" / "trial-0000_seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (not metrics.exists() or not metrics.stat().st_size) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)  # as Ctrl-C: the search stops its running trial
    assert proc.wait(120) == 130, (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert (group / "trial-0000" / "trial-0000_seed0" / "stopped.json").exists()  # the run stopped cleanly
    result = launcher.run("sweep", ["s.json"], cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    with sqlite3.connect(group / "study.db") as db:
        rows = db.execute("SELECT number, state FROM trials ORDER BY number").fetchall()
        lrs = db.execute("SELECT param_value FROM trial_params ORDER BY trial_id").fetchall()
    assert rows == [(0, "FAIL"), (1, "COMPLETE")] and lrs[0] == lrs[1]  # trial 0's settings asked again, once
    assert "again: trial 0 was interrupted" in result.stdout


def test_a_killed_searchs_running_trials_are_asked_again(tmp_path: Path) -> None:
    spec = parse_search({**SEARCH, "base": {**SEARCH["base"], "train_dir": str(tmp_path)}}, "g")
    study, resumed = open_study(spec, 1)
    trial = study.ask()
    trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    trial.set_user_attr("owner", {"host": os.uname().nodename, "pid": dead.pid})
    assert not resumed and recover_stale(study) == [0]
    again = study.ask()
    assert again.user_attrs["retry_of"] == 0 and again.suggest_float("lr", 1e-4, 1e-2, log=True) == trial.params["lr"]
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "RUNNING"]
