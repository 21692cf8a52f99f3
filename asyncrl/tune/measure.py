"""Measure one layout: a short `asyncrl-train` run in a child process (a fork of the tuner), read from its
metrics.jsonl.

The run is the real engine with every setting the user gave, the layout's flags on top, one record a second
(`--report-interval 1`) and no dashboard; it is stopped (SIGINT, a clean stop) once its records span the measured
seconds of stepping, so a slow start-up on a busy machine does not shorten the measurement. Its throughput is
counted from the first record with env steps (the start-up, forking the workers and the first batch, is left out)
to the last: env steps per second, and the share of
them the learner trained on (`1 - dropped_share`: samples dropped as too stale are not throughput). The verdict is
the interval verdict seen most often (asyncrl.diagnostics.bottleneck.dominant). Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.diagnostics.bottleneck import dominant
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.forked_run import ForkedRun

FRACTIONS = ("rollout_env_frac", "policy_infer_frac", "learner_train_frac", "learner_wait_frac")
GRACE_S = 60.0  # start-up allowed before the measured seconds (the run's --seconds is the two together)
POLL_S = 0.5  # how often the records are read


@dataclass
class Measurement:
    """What one short run showed: steps/s (all, and trained on), its verdict and stage shares, or an error."""

    sps: float = 0.0
    dropped_share: float = 0.0
    verdict: str | None = None
    reason: str = ""
    fractions: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str = ""

    @property
    def score(self) -> float:
        """Env steps per second the learner trained on."""
        return 0.0 if self.error else self.sps * (1.0 - self.dropped_share)


def summarize(records: list[dict[str, Any]]) -> Measurement:
    """The steady part of a run's records: from the first one with env steps to the last."""
    steady = [r for r in records if r.get("env_steps", 0) > 0 and "fatal" not in r]
    if not steady:
        return Measurement(error="no env steps recorded")
    first, last = steady[0], steady[-1]
    dt = last["time"] - first["time"]
    if dt >= 0.5:
        sps = (last["env_steps"] - first["env_steps"]) / dt
    else:  # one record: its own interval's rate
        sps = float(last.get("sps", 0.0))
    window = steady[1:] or steady
    fractions = {}
    for key in FRACTIONS:
        values = [r[key] for r in window if isinstance(r.get(key), int | float)]
        if values:
            fractions[key] = statistics.fmean(values)
    kind = dominant([r.get("bottleneck") for r in window])
    reason = next((r.get("bottleneck_reason") or "" for r in reversed(window) if r.get("bottleneck") == kind), "")
    return Measurement(sps=sps, dropped_share=float(last.get("dropped_share") or 0.0), verdict=kind,
                       reason=reason, fractions=fractions)


def train_args(flags: list[str], seconds: float, train_dir: str, experiment: str) -> list[str]:
    """The child's asyncrl-train arguments: the user's flags, then the measurement's own (they win)."""
    return [*flags, "--seconds", f"{seconds:g}", "--train-dir", train_dir, "--experiment", experiment,
            "--report-interval", "1", "--checkpoint-interval", "1e9", "--keep-checkpoints", "1", "--no-dashboard"]


def steady_span(records: list[dict[str, Any]]) -> float:
    """Seconds from the first record with env steps to the last."""
    steady = [r["time"] for r in records if r.get("env_steps", 0) > 0 and "fatal" not in r]
    return steady[-1] - steady[0] if steady else 0.0


def measure(entry: Callable[[list[str]], int], flags: list[str], seconds: float, train_dir: str,
            experiment: str) -> Measurement:
    """Run `entry(FLAGS)` (asyncrl-train's command-line entry, handed down by `asyncrl-tune`) as a fork of this
    process, in a new session, so a stuck run is stopped with all its processes, until its records span `seconds`
    of stepping (start-up not counted); stop it as Ctrl-C would, and summarise its records."""
    log_path = os.path.join(train_dir, f"{experiment}.log")
    run_dir = os.path.join(train_dir, experiment)
    os.makedirs(train_dir, exist_ok=True)
    t0 = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        proc = ForkedRun(entry, train_args(flags, seconds + GRACE_S, train_dir, experiment), fd)
    finally:
        os.close(fd)
    try:
        code = _wait_for_span(proc, run_dir, seconds, t0 + seconds + 2 * GRACE_S)
    except BaseException:  # Ctrl-C in the tuner: stop the child and its workers first
        _stop(proc)
        raise
    result = summarize(read_metrics(run_dir))
    result.wall_s = time.monotonic() - t0
    if code != 0:
        result.error = f"exit code {code}: {last_error(log_path)}"
    elif not result.sps and not steady_span(read_metrics(run_dir)):
        result.error = f"no env steps in its first {seconds + GRACE_S:.0f} s (start-up too slow on this machine)"
    elif not result.error and steady_span(read_metrics(run_dir)) < 0.5 * seconds:
        result.error = "too few seconds of stepping to measure (raise --seconds-per-layout)"
    return result


def _wait_for_span(proc: ForkedRun, run_dir: str, seconds: float, deadline: float) -> int:
    """Wait until the run's records span `seconds` of stepping, then SIGINT it (a clean stop); its exit code.
    A run past `deadline` is stopped with its whole session."""
    stopping = False
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            return proc.wait()
        if not stopping and steady_span(read_metrics(run_dir)) >= seconds:
            proc.send_signal(signal.SIGINT)
            stopping = True


def _stop(proc: ForkedRun) -> None:
    """SIGINT the run, then its whole session with SIGKILL if it has not ended in 30 s."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def last_error(log_path: str) -> str:
    """The run's error line (`asyncrl: error: ...`), or its last line."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [""])[-1][:200]
