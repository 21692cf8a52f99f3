"""`sampler`, `train` and `null`: run `asyncrl-train` and read its throughput from metrics.jsonl.

The trainer runs with `--report-interval` equal to the measurement window, so each metrics record is one
window. Records before the first frames (start-up) and the next one (warm-up) are dropped; the following
`repeats` records are the repetitions. Once they are written the bench stops the run with SIGINT, as Ctrl-C
would, and deletes its temporary train dir.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.windows import make_record, median_of, most_common
from asyncrl.diagnostics.metrics import read_metrics

STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.25
EXTRA_STAGE_KEYS = ("inference_batch_mean", "cpu_system", "cpu_run",  # and through Ray (ray_train)
                    "remote_bytes_per_s", "remote_slots_per_s", "remote_share", "remote_lag_mean")


class TrainerFailed(RuntimeError):
    """asyncrl-train exited before the measurement was complete."""


def measured_windows(records: list[dict[str, Any]], repeats: int, remote: bool = False) -> list[dict[str, Any]] | None:
    """The warm-up record then the `repeats` records after it (start-up records dropped: with `remote`, until
    remote actor groups' slots arrive too); None until complete."""
    first = next((i for i, r in enumerate(records)
                  if r.get("env_steps", 0) > 0 and (not remote or (r.get("remote_share") or 0) > 0)), None)
    if first is None:
        return None
    windows = records[first + 1:first + 2 + repeats]
    return windows if len(windows) == repeats + 1 else None


def mean_sps(warmup: dict[str, Any], last: dict[str, Any]) -> float | None:
    """Env steps over the whole measurement divided by its time: exact up to one report at each end."""
    dt = last["time"] - warmup["time"]
    return round((last["env_steps"] - warmup["env_steps"]) / dt, 1) if dt > 0 else None


def stale_share(warmup: dict[str, Any], windows: list[dict[str, Any]]) -> float | None:
    """The share of the env steps sampled over the measurement that the learner dropped as too stale
    (`--max-policy-lag`); None when the run reports no drops (an off-policy learner)."""
    if not any("dropped_stale" in w for w in windows):
        return None
    steps = windows[-1]["env_steps"] - warmup["env_steps"]
    return round(sum(w.get("dropped_stale", 0) for w in windows) / steps, 4) if steps > 0 else None


def stage_keys(windows: list[dict[str, Any]]) -> list[str]:
    """The runner's stage-time fractions (`*_frac`), the mean inference batch and the CPU shares."""
    keys = dict.fromkeys(k for w in windows for k, v in w.items() if k.endswith("_frac") and not isinstance(v, dict))
    return [*keys, *(k for k in EXTRA_STAGE_KEYS if any(k in w for w in windows))]


def limiting_stage(windows: list[dict[str, Any]]) -> str | None:
    """The runner's own bottleneck verdict (most frequent over the windows), or the classifier's if absent."""
    kinds = [w.get("bottleneck") for w in windows]
    if not any(kinds):
        try:
            from asyncrl.diagnostics.bottleneck import classify
        except ImportError:
            return None
        kinds = [v.kind if (v := classify(w)) else None for w in windows]
    return most_common(kinds)


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (the runner's orderly stop), then SIGTERM, then SIGKILL; children die with the runner."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S if sig == signal.SIGINT else 10)
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_trainer(s: BenchSettings, remote: bool = False) -> dict[str, Any]:
    """`s`'s asyncrl-train run measured over its metrics records; `remote`: the windows start once remote actor
    groups deliver (`ray_train`)."""
    train_dir = Path(tempfile.mkdtemp(prefix="asyncrl-bench-"))
    metrics, log_path = train_dir / "bench" / "metrics.jsonl", train_dir / "train.log"
    cmd = [sys.executable, "-m", "asyncrl.cli.train", *s.trainer_args(), "--train-dir", str(train_dir),
           "--experiment", "bench", "--report-interval", str(s.window_s), "--checkpoint-interval", "1e9"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                warmup, *windows = _wait_for_windows(proc, s, metrics, log_path, started, remote)
            finally:
                _stop(proc)
        log = log_path.read_text(errors="replace")
        first_frames = re.search(r"first frames ([0-9.]+) s", log)
        busiest = max(windows, key=lambda w: w["sps"])
        return make_record(
            s, [w["sps"] for w in windows], round(busiest["fps"] / busiest["sps"]) if busiest["sps"] else 1,
            stages={k: median_of([w.get(k) for w in windows]) for k in stage_keys(windows)},
            limited_by=limiting_stage(windows),
            fps_windows=[round(w["fps"], 1) for w in windows],
            sps_mean=mean_sps(warmup, windows[-1]),
            updates_per_s=median_of([w.get("learner_updates", 0) / s.window_s for w in windows])
            if s.mode == "train" else None,
            policy_lag_mean=median_of([w.get("policy_lag_mean") for w in windows]),
            stale_share=stale_share(warmup, windows) if s.mode == "train" else None,
            startup_s=float(first_frames.group(1)) if first_frames else None,
            compile_s=compile_seconds(log),
            trainer_args=[*s.trainer_args(), "--report-interval", str(s.window_s)],
        )
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)


def compile_seconds(log: str) -> float | None:
    """--compile: the seconds the learner's update and policy worker 0's act took to compile (None: eager)."""
    found = [float(x) for x in re.findall(r"(?:learner's update|policy worker 0: act) compiled in ([0-9.]+) s", log)]
    return round(sum(found), 1) if found else None


def _wait_for_windows(proc: subprocess.Popen, s: BenchSettings, metrics: Path, log_path: Path,
                      started: float, remote: bool = False) -> list[dict[str, Any]]:
    deadline = started + STARTUP_TIMEOUT_S + s.window_s * (s.repeats + 2)
    while time.monotonic() < deadline:
        windows = measured_windows(read_metrics(str(metrics.parent)), s.repeats, remote)
        if windows is not None:
            return windows
        if proc.poll() is not None:
            raise TrainerFailed(f"asyncrl-train exited with code {proc.returncode} before the measurement "
                                f"was complete:\n{_tail(log_path)}")
        time.sleep(POLL_S)
    raise TrainerFailed(f"no complete measurement within {deadline - started:.0f} s:\n{_tail(log_path)}")
