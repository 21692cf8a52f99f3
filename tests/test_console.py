"""The console and TensorBoard output: bottleneck line on change, progress percent and ETA, namespaced tags."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from asyncrl.config import Config
from asyncrl.diagnostics.metrics import MetricsWriter, read_metrics
from asyncrl.diagnostics.monitor import RunMonitor, verdict_changed
from asyncrl.diagnostics.progress import ProgressLine, format_duration
from asyncrl.diagnostics.tb_tags import tb_tag
from asyncrl.envs.null_env import NULL_SPEC
from tests.run_records import FakeChannels, FakeProc, fractions, run_records

ENV_BOUND = fractions(env=0.95, infer=0.10, lwait=0.95, copy=0.01, train=0.04)
TRAINING_BOUND = fractions(env=0.01, infer=0.30, lwait=0.02, copy=0.01, train=0.97)


def test_verdict_changed_rule() -> None:
    assert verdict_changed(None, "env") and verdict_changed("env", "training")
    assert not verdict_changed("env", "env")
    assert not verdict_changed("env", None)  # no verdict this interval: nothing to say


def test_monitor_prints_the_bottleneck_line_only_when_the_verdict_changes() -> None:
    lines: list[str] = []
    monitor = RunMonitor(Config(env="null", device="cpu"), NULL_SPEC, out=lambda s, **_: lines.append(s))
    phases = [ENV_BOUND] * 3 + [TRAINING_BOUND] * 2 + [{}] + [TRAINING_BOUND] + [ENV_BOUND]
    printed = []
    for i, fr in enumerate(phases):
        monitor.observe({**run_records(len(phases))[i], **fr}, [], {"learner": FakeProc()}, FakeChannels())
        monitor.flush()
        printed.append([line.split("(")[0].strip() for line in lines if "bottleneck:" in line])
        lines.clear()
    assert printed == [["bottleneck: environment-bound"], [], [], ["bottleneck: training-bound"], [], [], [],
                       ["bottleneck: environment-bound"]]


def record(time: float, frames: int) -> dict:
    return {"time": time, "frames": frames, "fps": 1000.0, "episode_return_mean": 12.5, "episodes": 40,
            "policy_version": 7, "policy_lag_mean": 1.5, "policy_lag_max": 3, "dropped_stale": 2}


def test_progress_line_with_a_frames_limit_shows_percent_and_eta() -> None:
    progress = ProgressLine(frames_limit=100_000)
    first = progress.line(record(10.0, 10_000))
    assert first == ("[     10s] frames       10,000 | fps    1,000 | return   12.50 (40 eps) | version 7 lag "
                     "mean 1.5 max 3 dropped <1% | 10% eta 1m30s")  # 1,000 frames/s since the start, 90,000 left
    # 40,000 frames in 20 s: 2,000 frames/s, 60,000 frames left -> 30 s
    assert progress.line(record(20.0, 40_000)).endswith(" | 40% eta 30s")
    assert progress.line(record(30.0, 100_000)).endswith(" | 100% eta 0s")
    for i in range(4, 10):  # the rate comes from the last 5 intervals: 5,000 frames/s from here on
        line = progress.line(record(10.0 * i, 100_000 + 50_000 * (i - 3)))
    assert line.endswith(" | 100% eta 0s")
    late = ProgressLine(frames_limit=10_000_000)
    for i in range(1, 10):  # 1,000 frames/s at first, then 5,000 frames/s for the last 5 intervals
        late.line(record(10.0 * i, 10_000 * i if i <= 4 else 40_000 + 50_000 * (i - 4)))
    assert late.line(record(100.0, 340_000)).endswith(" | 3% eta 32m12s")  # 9,660,000 frames at 5,000/s: 1,932 s


def test_progress_line_with_a_seconds_limit_and_both_limits() -> None:
    assert ProgressLine(seconds_limit=600).line(record(95.0, 1), loop_seconds=90.0).endswith(" | 15% eta 8m30s")
    both = ProgressLine(frames_limit=1_000_000, seconds_limit=60)
    # frames: 10% done, 90 s left at 10,000 frames/s; seconds: 10 s of 60 done, 50 s left: the seconds stop first
    assert both.line(record(10.0, 100_000), loop_seconds=10.0).endswith(" | 17% eta 50s")


def test_progress_line_without_limits_is_unchanged() -> None:
    assert ProgressLine().line(record(10.0, 10_000)).endswith("dropped <1%")


def test_progress_line_labels_the_lag_bound_and_the_dropped_share() -> None:
    """`lag mean 1.7 max 3 of 4` (of the --max-policy-lag bound), `dropped 82%` of the env steps."""
    line = ProgressLine().line({**record(10.0, 10_000), "env_steps": 10_000, "dropped_stale": 8_200,
                                "policy_lag_mean": 1.7, "policy_lag_max": 3, "policy_lag_limit": 4})
    assert line.endswith("version 7 lag mean 1.7 max 3 of 4 dropped 82%")
    quiet = ProgressLine().line({**record(10.0, 10_000), "dropped_stale": 0, "policy_lag_mean": None})
    assert quiet.endswith("version 7 lag - dropped 0%")
    # the learner's own share (its batches run ahead of the env steps the runner has tallied), else at most 100%
    ahead = {**record(4.0, 23_617), "env_steps": 23_617, "dropped_stale": 28_641, "dropped_share": 0.7360}
    assert ProgressLine().line(ahead).endswith("dropped 74%")
    assert ProgressLine().line({k: v for k, v in ahead.items() if k != "dropped_share"}).endswith("dropped 100%")


def test_progress_line_shows_the_mean_fps_for_a_short_tail() -> None:
    """The last record of a run that stopped just after a report covers a few ms: its own rate (1,171,836 fps for
    2,000 frames in 1.7 ms) is noise, so the line shows the mean over the recent intervals."""
    progress = ProgressLine()
    for i in range(1, 4):
        assert "| fps    1,000 |" in progress.line(record(5.0 * i, 5_000 * i))
    tail = progress.line({**record(15.0017, 17_000), "fps": 1_171_836.0})
    assert "| fps    1,133 mean |" in tail, tail  # 17,000 frames in 15.0 s
    assert "| fps    1,000 |" in ProgressLine().line(record(0.5, 500))  # a run shorter than one interval


def test_monitor_records_the_lag_bound_and_warns_of_stale_drops() -> None:
    lines: list[str] = []
    monitor = RunMonitor(Config(env="null", device="cpu", max_policy_lag=0), NULL_SPEC,
                         out=lambda s, **_: lines.append(s))
    rec = {**run_records(1)[0], "env_steps": 10_000, "dropped_stale": 8_200}
    extra = monitor.observe(rec, [], {"learner": FakeProc()}, FakeChannels())
    monitor.flush()
    assert extra["policy_lag_limit"] == 0 and "stale_dropped" in extra["alerts"]
    (warning,) = [line for line in lines if "stale_dropped" in line]
    assert "82% of the samples were dropped (8,200 samples)" in warning and "--max-policy-lag 0" in warning
    # from the learner's batches: 1,536 of 2,048 samples, then 1,536 of 4,096
    counted = RunMonitor(Config(env="null", device="cpu", max_policy_lag=0), NULL_SPEC, out=lambda s, **_: None)
    stats = [{"samples": 2048, "dropped_stale": 1536}]
    first = counted.observe(rec, stats, {"learner": FakeProc()}, FakeChannels())
    assert first["dropped_share"] == 0.75 and "stale_dropped" in first["alerts"]
    later = counted.observe(rec, [{"samples": 2048, "dropped_stale": 0}], {"learner": FakeProc()}, FakeChannels())
    assert later["dropped_share"] == 0.375
    fine = RunMonitor(Config(env="null", device="cpu"), NULL_SPEC, out=lambda s, **_: None)
    ok = {**run_records(1)[0], "env_steps": 10_000, "dropped_stale": 2_000}  # a fifth exactly: no warning
    assert "stale_dropped" not in fine.observe(ok, [], {"learner": FakeProc()}, FakeChannels())["alerts"]


def test_bottleneck_line_knows_a_solved_run() -> None:
    """CartPole-v1 solved (mean return 475 or more): no GPU advice for a run that has already done its job."""
    lines: list[str] = []
    monitor = RunMonitor(Config(env="CartPole-v1", device="cpu"), NULL_SPEC, out=lambda s, **_: lines.append(s))
    for ret in (100.0, 480.0):
        monitor.observe({**run_records(1)[0], **TRAINING_BOUND, "episode_return_mean": ret}, [],
                        {"learner": FakeProc()}, FakeChannels())
        monitor.flush()
    before, after = [line for line in lines if "bottleneck:" in line]
    assert "--device cuda" in before and "--device cuda" not in after
    assert "reached CartPole-v1's solved return (475)" in after


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 59.4, 61, 3599, 3600, 7325)] == ["0s", "59s", "1m01s", "59m59s",
                                                                               "1h00m", "2h02m"]


@pytest.mark.parametrize("key, tag", [
    ("episode_return_mean", "episode/episode_return_mean"), ("episodes", "episode/episodes"),
    ("policy_loss", "losses/policy_loss"), ("grad_norm", "losses/grad_norm"), ("kl", "policy/kl"),
    ("entropy", "policy/entropy"), ("policy_lag_max", "policy/policy_lag_max"), ("fps", "perf/fps"),
    ("learner_train_frac", "perf/learner_train_frac"), ("queue_full", "perf/queue_full"),
    ("cpu_learner", "sys/cpu_learner"), ("rss_mb_total", "sys/rss_mb_total"), ("gpu_util", "sys/gpu_util"),
    ("worker_restarts", "health/worker_restarts"), ("nonfinite_updates", "health/nonfinite_updates"),
])
def test_tag_namespaces(key: str, tag: str) -> None:
    assert tb_tag(key) == tag


def test_metrics_writer_namespaces_tensorboard_tags_and_keeps_jsonl_keys(tmp_path: Path) -> None:
    rec = {**record(5.0, 5000), "policy_loss": 0.1, "cpu_total": 50.0, "env_errors": 0, "bottleneck": "env",
           "learner_copy_frac": 0.01}
    writer = MetricsWriter(str(tmp_path))
    writer.write(rec, step=5000)
    writer.close()
    assert read_metrics(str(tmp_path)) == [json.loads(json.dumps(rec))]
    (events,) = [os.path.join(tmp_path, "tb", f) for f in os.listdir(tmp_path / "tb")]
    tags = {v.tag for e in EventFileLoader(events).Load() if e.HasField("summary") for v in e.summary.value}
    assert tags == {"perf/frames", "perf/fps", "episode/episode_return_mean", "episode/episodes",
                    "policy/policy_version", "policy/policy_lag_mean", "policy/policy_lag_max", "policy/dropped_stale",
                    "losses/policy_loss", "sys/cpu_total", "health/env_errors", "perf/learner_copy_frac"}
