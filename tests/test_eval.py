"""Evaluation during training (--eval-every): results in metrics.jsonl and TensorBoard, checkpoints/best.pt and
eval videos, with the real runner, evaluation process and shared weights (one short CartPole run)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from asyncrl.cli.train import main as train_main
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.runtime.store.best_checkpoint import best_path, save_best
from asyncrl.runtime.store.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
from tests.conftest import TrainRun, read_metrics, run_cli, start_train, wait_for

# CartPole whose steps sleep 2 ms, so the cores are free for the evaluator to finish its periodic evaluations
# (on plain CartPole the learner keeps both cores busy and only the final one completes); one report interval
# spans the run, so several evaluations arrive within it.
EVAL_FLAGS = ["--env", "tests.faults:make_slow_cartpole", "--frames", "4000", "--workers", "2",
              "--report-interval", "60", "--eval-every", "1000", "--eval-episodes", "2", "--eval-video"]


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    train_dir = tmp_path_factory.mktemp("eval")
    done = run_cli([*EVAL_FLAGS, "--experiment", "ev"], train_dir, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return train_dir / "ev", done.stdout + done.stderr


def test_eval_results_go_to_metrics_and_tensorboard(eval_run: tuple[Path, str]) -> None:
    run_dir, stdout = eval_run
    records = read_metrics(run_dir)
    evals = [r for r in records if "eval_return_mean" in r]
    assert evals, f"no eval_* values in metrics.jsonl\n{stdout[-3000:]}"
    for r in evals:
        for key in ("eval_return_mean", "eval_return_std", "eval_sampled_return_mean", "eval_sampled_return_std"):
            assert isinstance(r[key], float | int) and math.isfinite(r[key]), (key, r)
        assert 1 <= r["eval_return_mean"] <= 500 and r["eval_return_std"] >= 0  # CartPole returns
        assert r["eval_policy_version"] >= 1 and 0 < r["eval_frames"] <= r["frames"]
    # The final weights are evaluated once the run has reached --frames, and that lands in the last record.
    assert "eval_return_mean" in records[-1] and records[-1]["eval_frames"] >= 4000
    assert records[-1]["eval_best_return"] == max(r["eval_return_mean"] for r in evals)
    # Every evaluation played to the end (each wrote its video) has a record of its own, also when several
    # arrive within one report interval (60 s here). On a quiet machine three do (a record kept only the last of
    # them before b6caadb); with every core busy the periodic ones, at nice 19, may be starved until the final
    # evaluation supersedes them, and only that one completes.
    videos = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "videos").glob("eval_*.mp4"))
    assert videos and [r["eval_frames"] for r in evals] == videos

    events = [e for f in sorted((run_dir / "tb").iterdir()) for e in EventFileLoader(str(f)).Load()]
    tags = {v.tag for e in events if e.HasField("summary") for v in e.summary.value}
    assert {"eval/eval_return_mean", "eval/eval_sampled_return_mean", "eval/eval_return_std"} <= tags
    videos = [v for e in events if e.HasField("summary") for v in e.summary.value if v.tag == "eval/eval_video"]
    # An image summary (TensorBoard's loader turns it into [width, height, encoded]) holding an animated GIF.
    assert videos and videos[0].tensor.string_val[2][:6] == b"GIF89a"


def test_best_checkpoint_loads_with_weights_only_and_is_not_resumed(eval_run: tuple[Path, str],
                                                                     tmp_path: Path) -> None:
    run_dir, _ = eval_run
    path = best_path(str(run_dir))
    state = torch.load(path, map_location="cpu", weights_only=True)  # no pickled code: plain data only
    best = max(r["eval_return_mean"] for r in read_metrics(run_dir) if "eval_return_mean" in r)
    assert state["eval"]["return_mean"] == pytest.approx(best)
    assert isinstance(state["learner"]["version"], int) and state["learner"]["version"] >= 1
    cfg = Config.from_dict(json.loads(state["config"]))
    model = build_model(make_env_spec(state["env"]), cfg.hidden_size, cfg.normalize_obs)
    model.load_state_dict(state["learner"]["model"])  # what asyncrl-enjoy does with a checkpoint

    assert path not in list_checkpoints(str(run_dir))
    latest, _ = load_latest_checkpoint(str(run_dir))
    assert os.path.basename(latest).startswith("ckpt_")
    # best.pt alone is not a checkpoint to resume from.
    for ckpt in list_checkpoints(str(run_dir)):
        os.replace(ckpt, tmp_path / os.path.basename(ckpt))
    try:
        done = run_cli([*EVAL_FLAGS, "--experiment", "ev", "--resume"], run_dir.parent, timeout=120)
    finally:
        for moved in tmp_path.glob("ckpt_*.pt"):
            os.replace(moved, run_dir / "checkpoints" / moved.name)
    assert done.returncode == 2 and "no checkpoint to resume" in done.stderr, done.stderr


def test_eval_video_is_written(eval_run: tuple[Path, str]) -> None:
    import imageio.v2 as imageio

    run_dir, _ = eval_run
    videos = sorted((run_dir / "videos").glob("eval_*.mp4"))
    assert videos and all(v.stat().st_size > 0 for v in videos)
    with imageio.get_reader(videos[-1]) as reader:  # not mimread: a 500-step episode passes its memory limit
        count, first = reader.count_frames(), reader.get_data(0)
    assert count >= 2 and first.ndim == 3 and first.shape[2] == 3
    assert np.ptp(first) > 0  # a rendered picture, not a blank one
    assert int(videos[-1].stem.split("_")[1]) >= 1500  # named after the frames it was evaluated at


def test_keep_checkpoints_never_prunes_best(tmp_path: Path) -> None:
    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path), experiment="prune", eval_every=1)
    model = build_model(make_env_spec(cfg.env))
    save_best(cfg, model, version=1, frames=100, return_mean=9.0, return_std=0.0)
    for version in range(1, 5):
        save_checkpoint(cfg.run_dir, version, {"learner": {"model": model.state_dict(), "version": version}}, keep=1)
    assert [os.path.basename(p) for p in list_checkpoints(cfg.run_dir)] == ["ckpt_0000000004.pt"]
    assert torch.load(best_path(cfg.run_dir), weights_only=True)["eval"]["return_mean"] == 9.0


def test_an_evaluations_files_appear_only_when_its_report_is_received(tmp_path: Path) -> None:
    """best.pt and the videos of an evaluation are staged, then moved into place when the runner receives its
    report: an evaluator killed between writing them and reporting (the runner replaces the periodic one for the
    final evaluation, after 5 s, and at nice 19 on busy cores its writes can take longer) leaves no file that no
    metrics record accounts for. A fresh-clone CI run failed so, with best.pt at a return that no record had."""
    from asyncrl.agents.registry import learner_class
    from asyncrl.runtime.plumbing.eval_schedule import EvalSchedule
    from asyncrl.runtime.stages.evaluation import evaluate

    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path), experiment="staged", eval_every=500, eval_episodes=1,
                 eval_video=True)
    spec = make_env_spec(cfg.env)
    torch.manual_seed(0)
    model = learner_class(cfg.algo).build_policy(spec, cfg, torch.device("cpu")).eval()
    warnings: list[str] = []
    reported, best = evaluate(cfg, spec, model, 1, 500, None, lambda: True, warnings.append)
    lost, _ = evaluate(cfg, spec, model, 2, 1000, None, lambda: True, warnings.append)  # its report never comes
    run_dir = Path(cfg.run_dir)
    assert not warnings and reported is not None and lost is not None
    assert not Path(best_path(cfg.run_dir)).exists() and not (run_dir / "videos").exists()  # nothing in place yet
    schedule = EvalSchedule(cfg)
    schedule.receive(reported)
    assert torch.load(best_path(cfg.run_dir), weights_only=True)["eval"]["return_mean"] == best
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["eval_500.gif", "eval_500.mp4"]
    assert [v["video"] for v in schedule.pop_videos()] == [str(run_dir / "videos" / "eval_500.mp4")]
    schedule.discard_staged()  # the run's end: the lost evaluation's files go
    assert not (run_dir / ".eval_staging").exists()
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["eval_500.gif", "eval_500.mp4"]


@pytest.mark.parametrize("flags, message", [
    (["--eval-every", "-1"], "--eval-every must not be negative"),
    (["--eval-every", "100", "--eval-episodes", "0"], "--eval-episodes must be at least 1"),
    (["--eval-video"], "--eval-video records evaluation episodes; add --eval-every"),
])
def test_bad_eval_flags_exit_2(flags: list[str], message: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    code = train_main(["--env", "CartPole-v1", "--train-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_killed_evaluator_is_restarted_and_training_goes_on(tmp_path: Path, reap: list[TrainRun]) -> None:
    # 40,000 frames: a few seconds of training after the kill (--frames stops within a step; at 8,000 a quiet run
    # ended in 0.3 s, and the evaluator killed was the final evaluation's)
    run = start_train(["--env", "CartPole-v1", "--frames", "40000", "--workers", "2", "--report-interval", "60",
                       "--eval-every", "2000", "--eval-episodes", "1"], tmp_path / "train", "kill")
    reap.append(run)

    def evaluator() -> psutil.Process | None:
        for child in psutil.Process(run.pid).children():
            try:
                if child.cmdline()[:1] == ["asyncrl-eval"]:
                    return child
            except (psutil.Error, IndexError):
                continue
        return None

    first = wait_for(evaluator, timeout=120, proc=run.proc)
    assert first is not None, run.stdout()[-2000:] + run.stderr()[-2000:]
    first.kill()
    assert run.wait(timeout=600) == 0, run.stdout()[-2000:] + run.stderr()[-2000:]
    assert "eval-0 was killed by SIGKILL; restarted it (training was not affected)" in run.stdout(), run.stdout()
    records = read_metrics(run.run_dir)
    assert records[-1]["frames"] >= 40000 and records[-1]["policy_restarts"] == 0
    assert "eval_return_mean" in records[-1]  # the new evaluator served the final evaluation


def test_evaluator_steps_envs_with_separate_terminated_and_truncated() -> None:
    """The evaluator also drives the VecEnv.step that reports terminated and truncated apart."""
    from asyncrl.runtime.stages.evaluation import _stepper

    class SplitEndEnv:
        def step(self, actions, obs_out, reward_out, terminated_out, truncated_out, final_obs_out):
            terminated_out[:] = [True, False, False]
            truncated_out[:] = [False, True, False]
            reward_out[:] = 1.0
            return []

    obs, reward, done = np.zeros((3, 4), np.float32), np.zeros(3, np.float32), np.zeros(3, np.bool_)
    _stepper(SplitEndEnv(), obs)(np.zeros(3, np.int64), obs, reward, done)
    assert done.tolist() == [True, True, False] and reward.tolist() == [1.0, 1.0, 1.0]
