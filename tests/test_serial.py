"""`--serial`: the whole run in one process. It learns CartPole without ever making a child process, writes the
forked engine's metrics and checkpoints (loadable, resumable), keeps the slots' bookkeeping for NEXT_STEP resets
and replaced env instances, and refuses settings that make no sense for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import asyncrl
from asyncrl.cli.train import main as train_main
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.resolve import config_from_flags
from asyncrl.runtime.store.checkpoint import list_checkpoints
from tests import launcher
from tests.conftest import run_cli
from tests.counter_envs import raise_once_again

ROOT = Path(__file__).resolve().parent.parent
# The learning bar: a 100-episode mean return of 300 within 150,000 env steps (random play scores 22.7), as in
# test_api. The run stops at the bar, so its cost is the env steps to it: seeds 0-7 reached it after 45.0k, 48.3k,
# 54.4k, 58.4k, 72.2k, 62.0k, 50.3k and 52.3k env steps (2026-12-07, the 2 cores loaded by other test runs), seed 4
# after 75.3k in a test run; seed 0, the quickest, after 43.2k-45.0k in six runs (the same learning each time: the
# mean at the bar was 301.18 in all six; the reports' timing moves the step count), a third of the budget. The full
# claim, 475 within the same budget (seeds 0, 1, 2: 65,235, 103,926 and 117,591 env steps, 17-33 s), is
# scripts/serial_cartpole.py's default run.
TARGET, FRAMES, SEED = 300.0, 150_000, 0
# What every record of the forked engine has (runner._report): the serial loop writes them too.
RECORD_KEYS = {
    "time", "frames", "env_steps", "fps", "sps", "episodes", "episodes_truncated", "truncations_unbootstrapped",
    "episode_return_mean", "episode_return_mean_20", "episode_len_mean", "policy_version", "dropped_stale",
    "learner_updates", "policy_loss", "value_loss", "entropy", "kl", "grad_norm", "policy_lag_mean",
    "policy_lag_max", "learning_rate", "rollout_env_frac", "rollout_wait_frac", "policy_infer_frac",
    "learner_train_frac", "learner_wait_frac", "learner_copy_frac", "inference_batch_mean", "worker_restarts",
    "policy_restarts", "env_errors", "entropy_floor", "procs", "rss_mb_total", "cpu_system", "bottleneck",
    "bottleneck_reason", "alerts",
}
SHORT = ["--env", "CartPole-v1", "--serial", "--envs-per-worker", "8", "--batch-size", "256", "--epochs", "4",
         "--minibatches", "2", "--report-interval", "0.5", "--checkpoint-interval", "1", "--eval-every", "1000",
         "--eval-episodes", "2", "--experiment", "s"]
# The two runs of the resume test, in env steps: 5+ updates of 256 each, a periodic evaluation and the final one.
FIRST, RESUMED = 1500, 3000


def test_serial_cartpole_learns_without_a_child_process() -> None:
    """The learning run of scripts/serial_cartpole.py (psutil samples of its children, an audit hook on every
    fork, exec and spawn inside it), with the test's lower bar."""
    proc = launcher.run(f"{launcher.SCRIPT}{ROOT / 'scripts' / 'serial_cartpole.py'}",
                        ["--seeds", str(SEED), "--target", str(TARGET), "--frames", str(FRAMES)], cwd=ROOT, timeout=240)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, result
    assert result["samples"] > 100 and result["children"] == [] and result["spawned"] == [], result
    reached = result["reached"]
    assert reached is not None and reached["env_steps"] <= FRAMES, result
    assert result["stop_reason"] == "callback" and proc.returncode == 0
    print(f"\nserial CartPole-v1: mean return {TARGET:g} at {reached['env_steps']:,} env steps "
          f"({reached['time']:.1f} s), {result['samples']} samples of its children, none seen")


def test_a_serial_run_saves_metrics_and_checkpoints_that_load_and_resume(tmp_path: Path, shm_guard,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """The first run is asyncrl-train's main() in this process (a serial run forks nothing, and a fresh
    interpreter's imports would be most of its time); the resumed one is the console script, a new process that
    finds everything it needs on disk."""
    capsys.readouterr()
    code = train_main([*SHORT, "--frames", str(FIRST), "--train-dir", str(tmp_path)])
    first = capsys.readouterr()
    assert code == 0, first.err[-3000:]
    assert "in this one process (--serial)" in first.out and "final checkpoint" in first.out
    run_dir = tmp_path / "s"
    records = read_metrics(str(run_dir))
    assert records and all(RECORD_KEYS <= set(r) for r in records), RECORD_KEYS - set(records[-1])
    last = records[-1]
    assert last["env_steps"] >= FIRST and last["policy_version"] > 1 and last["worker_restarts"] == 0
    assert last["eval_frames"] == last["frames"] and last["eval_return_mean"] > 0  # the final evaluation
    assert (run_dir / "checkpoints" / "best.pt").exists() and (run_dir / "checkpoints" / "meta.json").exists()
    saved = list_checkpoints(str(run_dir))
    assert saved and (run_dir / "initial_weights.sha256").exists()
    assert json.loads((run_dir / "config.json").read_text())["serial"] is True

    policy = asyncrl.load_policy(str(run_dir))
    actions = policy(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}

    second = run_cli(["--resume", "--experiment", "s", "--frames", str(RESUMED)], tmp_path, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "--serial" in second.stdout  # config.json's serial stands
    resumed = read_metrics(str(run_dir))[len(records):]
    assert resumed and resumed[0]["env_steps"] > last["env_steps"] and resumed[0]["time"] > last["time"]
    assert resumed[-1]["env_steps"] >= RESUMED and resumed[-1]["policy_version"] > last["policy_version"]
    assert resumed[-1]["episodes"] > last["episodes"]  # the counters continue
    assert max(int(Path(p).stem.split("_")[1]) for p in list_checkpoints(str(run_dir))) == \
        resumed[-1]["policy_version"]


@pytest.mark.parametrize("flags, environ, says", [
    (["--policy-workers", "2"], {}, "--serial acts in its one process"),
    (["--device", "cpu"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": "29500"}, "--serial runs in one process, but torchrun started 2 ranks"),
])
def test_serial_refuses_what_makes_no_sense(flags: list[str], environ: dict[str, str], says: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    code = train_main(["--env", "CartPole-v1", "--serial", *flags, "--train-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "CartPole-v1").exists()  # refused before anything was written


def test_the_exit_code_of_a_refused_serial_run_is_2(tmp_path: Path) -> None:
    proc = run_cli(["--env", "CartPole-v1", "--serial", "--policy-workers", "3", "--print-config"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--policy-workers 3" in proc.stderr


# ----- the slots' bookkeeping, in this process -----
def serial_slots(tmp_path: Path, env: str, frames: int) -> tuple[list[dict[str, np.ndarray]], dict]:
    """A serial run of 2 envs in one split, rollout 8, until `frames` env steps, whose every full slot is copied
    instead of trained on: the slots in order and the last metrics record."""
    from asyncrl.runtime.serial import SerialRun

    cfg = config_from_flags(env=env, serial=True, train_dir=str(tmp_path), experiment="b", workers=1,
                            worker_splits=1, envs_per_worker=2, rollout=8, batch_size=16, minibatches=1, epochs=1,
                            frames=frames, report_interval=100.0, seed=1)
    run = SerialRun(cfg, out=lambda *a, **k: None)
    slots: list[dict[str, np.ndarray]] = []
    run._update = lambda full: slots.extend({k: a[s].copy() for k, a in run.traj.items()} for s in full)
    assert run.run() == 0
    return slots, read_metrics(str(tmp_path / "b"))[-1]


def test_next_step_resets_are_left_out_and_start_episodes(tmp_path: Path) -> None:
    slots, record = serial_slots(tmp_path, "tests.counter_envs:make_next_step_counters", frames=49)
    assert len(slots) == 4  # 6 agent steps per env and slot: rows 3 and 7 are the envs' own resets
    for slot in slots:
        valid, first, terminated = slot["valid"][:, 0], slot["first"][:, 0], slot["terminated"][:, 0]
        np.testing.assert_array_equal(valid, [1, 1, 1, 0, 1, 1, 1, 0])
        np.testing.assert_array_equal(terminated, [0, 0, 1, 0, 0, 0, 1, 0])
        assert first[4] and first[8] and not first[1:3].any() and not first[5:7].any()
        assert (slot["obs"][4, :, 0] == 0).all()  # the reset's observation starts the episode
        np.testing.assert_array_equal(slot["final_step"], [-1, -1])
    assert record["env_steps"] == 50 and record["episodes"] == 16 and record["episode_len_mean"] == 3.0


def test_a_replaced_env_instance_leaves_its_step_out(tmp_path: Path) -> None:
    raise_once_again()
    slots, record = serial_slots(tmp_path, "tests.counter_envs:make_raising_counter", frames=33)
    assert len(slots) == 2 and record["env_errors"] == 1
    invalid = np.argwhere(~slots[0]["valid"])
    np.testing.assert_array_equal(invalid, [[4, 0]])  # env 0's fifth step raised
    assert slots[0]["first"][5, 0] and not slots[0]["first"][5, 1]  # its fresh instance starts an episode
    assert slots[1]["valid"].all() and not slots[1]["first"][1:].any()


def test_a_split_whose_backend_raises_loses_the_step_and_starts_afresh(tmp_path: Path) -> None:
    raise_once_again()
    slots, record = serial_slots(tmp_path, "tests.counter_envs:make_raising_vector", frames=31)
    assert len(slots) == 2 and record["env_errors"] == 2  # both envs of the split
    np.testing.assert_array_equal(np.argwhere(~slots[0]["valid"]), [[4, 0], [4, 1]])
    assert slots[0]["first"][5].all() and (slots[0]["obs"][5] == 0).all()  # reset into the next row
    assert not slots[0]["terminated"][4].any() and (slots[0]["rewards"][4] == 0).all()
    assert record["env_steps"] == 32  # the lost step is not counted
