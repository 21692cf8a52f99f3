"""End to end, with real processes and no mocks: a 32-worker Atari run with Ctrl-C, and --resume.

CartPole learning with the default settings is checked on the one learning run tests/test_api.py shares (the
same runner through `asyncrl.train()`, whose resolved settings it compares with asyncrl-train's). Run with
`pytest -s tests/test_e2e.py` to see the measured figures (time to first frames, RSS).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from asyncrl.runtime.roles.runner import SHUTDOWN_TIMEOUT_S
from asyncrl.runtime.store.checkpoint import list_checkpoints
from tests.conftest import TrainRun, shm_entries, start_train, wait_for

WARMUP = 10_000_000  # --lr-warmup frames in the resume test: the whole of both runs is on the ramp
CARTPOLE_FLAGS = ["--env", "CartPole-v1", "--frames", "150000"]  # the resume test stops on --seconds first
# Ctrl-C to exit: the runner's own timeline (notice within 50 ms, SHUTDOWN_TIMEOUT_S of joins, then 2 s per
# killed child) plus a generous margin for a busy machine.
EXIT_LIMIT_S = SHUTDOWN_TIMEOUT_S + 30.0
MAX_POLICY_LAG = 4  # the default, which the Pong run keeps


def first_record(records: list[dict], key: str, threshold: float) -> dict | None:
    return next((r for r in records if r.get(key) is not None and r[key] >= threshold), None)


def title(proc: psutil.Process) -> str:
    """The process title set by setproctitle (asyncrl-learner, asyncrl-rollout-7, ...)."""
    try:
        cmdline = proc.cmdline()
        return cmdline[0] if cmdline else proc.name()
    except psutil.Error:
        return ""


def stop_with_ctrl_c(run: TrainRun, limit_s: float) -> tuple[int, float]:
    """Ctrl-C the run; its exit code and how long it took to exit (fails the test past limit_s)."""
    t0 = time.monotonic()
    run.ctrl_c()
    try:
        code = run.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"asyncrl-train did not exit within {limit_s:.0f} s of Ctrl-C\n{run.stdout()[-2000:]}")
    return code, time.monotonic() - t0


def test_pong_32_workers_runs_and_stops_cleanly_on_ctrl_c(tmp_path: Path, reap: list[TrainRun]) -> None:
    shm_before = shm_entries()
    # The recipes' Atari layout (tests/doc_session.py's SLOW_START_LAYOUT): one game a worker, and batches of 256
    # rather than the Atari preset's 1,024. What is tested is 32 workers starting and stopping, not the batch nor
    # double buffering; each game costs 0.2 s of CPU to start (ale_py loads its ROM at construction and again at
    # the seeded reset), so 2 a worker took 19-20 s of CPU for the test on a quiet machine, 1 a worker 12-14 s
    # (2026-12-05, two runs each).
    run = start_train(["--env", "atari_pong", "--workers", "32", "--envs-per-worker", "1", "--worker-splits", "1",
                       "--batch-size", "256",
                       "--seconds", "300", "--report-interval", "1", "--max-policy-lag", str(MAX_POLICY_LAG)],
                      tmp_path / "train", "pong32", fresh=True)  # the script itself: its start-up and RSS are printed
    reap.append(run)
    runner = psutil.Process(run.pid)

    first = wait_for(lambda: first_record(run.records(), "frames", 1), timeout=90, proc=run.proc)
    t_first = time.monotonic() - run.started
    assert first, f"no frames within 90 s\n{run.stdout()[-3000:]}{run.stderr()[-2000:]}"
    children = runner.children(recursive=True)
    titles = {c.pid: title(c) for c in children}
    rollouts = [c for c in children if titles[c.pid].startswith("asyncrl-rollout-")]
    assert len(rollouts) == 32, sorted(titles.values())
    assert any(t == "asyncrl-learner" for t in titles.values())
    mem = rollouts[0].memory_full_info()
    print(f"\n32-worker atari_pong: first frames {t_first:.1f} s after launch (metrics record at "
          f"{first['time']:.1f} s of runner time); {titles[rollouts[0].pid]} RSS {mem.rss / 2**20:.0f} MiB, "
          f"USS {mem.uss / 2**20:.0f} MiB; all {len(rollouts)} rollout workers RSS "
          f"{sum(c.memory_info().rss for c in rollouts) / 2**20:.0f} MiB")

    # Let the learner publish its first updates, then Ctrl-C as a user would.
    wait_for(lambda: first_record(run.records(), "policy_version", 3), timeout=40, proc=run.proc)
    assert run.proc.poll() is None, f"the run ended by itself\n{run.stdout()[-3000:]}{run.stderr()[-2000:]}"
    code, took = stop_with_ctrl_c(run, EXIT_LIMIT_S)
    print(f"32-worker atari_pong: exited with code {code} {took:.1f} s after Ctrl-C")
    assert code == 0, run.stderr()
    assert "stopping (SIGINT)" in run.stdout()

    records = run.records()
    assert records and records[-1]["frames"] > 0
    lags = [r["policy_lag_max"] for r in records if r.get("policy_lag_max") is not None]
    assert lags, "the learner never reported an update"
    print(f"32-worker atari_pong: {records[-1]['frames']:,} frames, policy version {records[-1]['policy_version']}, "
          f"policy_lag_max {max(lags)}, dropped_stale {records[-1]['dropped_stale']}")
    assert list_checkpoints(str(run.run_dir)), "Ctrl-C must leave a checkpoint"
    assert shm_entries({run.pid, *titles}) - shm_before == set()
    _, alive = psutil.wait_procs(children, timeout=2)
    survivors = [f"{c.pid} {titles[c.pid]}" for c in alive if c.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, f"child processes outlived the runner: {survivors}"
    assert "Traceback" not in run.stderr()


def test_resume_continues_versions_and_frames(tmp_path: Path, reap: list[TrainRun]) -> None:
    """--resume goes on from the saved version and frame count, and so does the learning-rate warm-up."""
    flags = [*CARTPOLE_FLAGS, "--report-interval", "1", "--lr-schedule", "constant", "--lr-warmup", str(WARMUP)]
    # 3 s per run (was 4): at 2 s on a machine loaded 20x the first run stopped at version 3-4 and the resumed one
    # went 2 versions past the saved one, in 3 of 3 runs (the bars: above 1, and past the saved version).
    first = start_train([*flags, "--seconds", "3"], tmp_path / "train", "resume")
    reap.append(first)
    assert first.wait(timeout=90) == 0, first.stderr()
    before = first.records()
    assert before, first.stdout()
    last = before[-1]
    checkpoints = list_checkpoints(str(first.run_dir))
    assert checkpoints, "a run that ends on --seconds must leave a checkpoint"
    saved_version = int(Path(checkpoints[0]).stem.split("_")[1])
    assert saved_version >= last["policy_version"] > 1 and last["frames"] > 0

    second = start_train([*flags, "--seconds", "3", "--resume"], tmp_path / "train", "resume")
    reap.append(second)
    assert second.wait(timeout=90) == 0, second.stderr()
    assert "resumed from" in second.stdout()
    after = second.records()[len(before):]
    assert after, "the resumed run wrote no metrics"
    assert after[0]["policy_version"] >= saved_version, (last, after[0])
    assert all(r["frames"] >= last["frames"] for r in after), (last, after[0])
    assert after[-1]["policy_version"] > saved_version and after[-1]["frames"] > last["frames"]
    # The warm-up (far longer than the runs): an update's rate is --lr x the samples trained so far / WARMUP, so
    # under --lr x the frames of both runs / WARMUP (x 2: the records' frames come from the workers' reports, a
    # second behind the samples the learner has; seen 19% behind), rising, and the resumed run picks the ramp up
    # where it was (restarted, it would begin near 0 again). Without the ramp the rate is --lr, 30x over `top`.
    lr = json.loads((first.run_dir / "config.json").read_text())["lr"]
    rates = [r["learning_rate"] for r in [*before, *after] if r.get("learning_rate")]
    top = 2 * lr * after[-1]["frames"] / WARMUP
    assert rates and all(0 < rate <= top for rate in rates), (lr, top, rates)
    assert all(b >= a for a, b in zip(rates, rates[1:])), rates
    print(f"\nresume: first run stopped at version {last['policy_version']} / {last['frames']:,} frames; "
          f"resumed run went on from version {after[0]['policy_version']} / {after[0]['frames']:,} frames to "
          f"{after[-1]['policy_version']} / {after[-1]['frames']:,}")
