"""The runner's side of evaluation during training (`--eval-every`): when to evaluate, and what came back.

The runner asks for an evaluation by writing the current frame count into a small shared block that the
evaluation process (`runtime/roles/evaluator.py`) polls; a request made while an evaluation is still running is
merged into the next one (only the newest frame count is kept), so a slow evaluation never queues up work.
Results arrive as `eval` reports and are added to the next metrics record (keys `eval_*`, TensorBoard
`eval/`). When --frames, --seconds or a callback stops a run, the final weights are evaluated once more after the
samplers have stopped, and that result goes into the last record. Torch-free, like the runner.

An evaluation's files (a new `checkpoints/best.pt`, `videos/eval_<frames>.mp4` and `.gif`) are written under
`<run dir>/.eval_staging/<frames>/` and moved into place when its report is received, just before its numbers
wait for their record: an evaluator stopped or killed part-way (the runner replaces the periodic one for the final
evaluation) leaves no best.pt or video that no record accounts for. What such an evaluator staged is removed at the
run's end.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np

from asyncrl.config import Config
from asyncrl.shm import SharedArrays

RESULT_KEYS = ("eval_return_mean", "eval_return_std", "eval_sampled_return_mean", "eval_sampled_return_std",
               "eval_len_mean", "eval_policy_version", "eval_frames", "eval_seconds", "eval_best_return")
FINAL_TIMEOUT_S = 300.0  # the longest a finished run waits for its final evaluation
# Stops after which the final weights are evaluated: a callback's stop too (a run stopped once it is solved would
# otherwise leave best.pt to a periodic evaluation of weights thousands of steps older, or to none); not a signal.
FINAL_EVAL_REASONS = ("frames", "seconds", "callback")
DUE, FINAL = 0, 1  # the request block: frames to evaluate at; 1 when that is the final evaluation
STAGING = ".eval_staging"  # under the run directory: an evaluation's files until its report is received


def staging_dir(run_dir: str, frames: int) -> str:
    """Where the evaluation at `frames` writes its files before they are moved into place."""
    return os.path.join(run_dir, STAGING, str(frames))


def commit_outputs(staged: list[tuple[str, str]]) -> None:
    """Move an evaluation's staged files to their places (each an atomic rename on the run's file system)."""
    for src, dst in staged:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
    for folder in {os.path.dirname(src) for src, _ in staged}:
        try:
            os.rmdir(folder)
        except OSError:
            pass


class EvalSchedule:
    """Requests an evaluation every `cfg.eval_every` frames and keeps the results for the next metrics record."""

    def __init__(self, cfg: Config):
        self.every = cfg.eval_every
        self.run_dir = cfg.run_dir
        self.request = SharedArrays({"due": ((2,), np.dtype(np.int64))}) if self.every else None
        self.next_due: int | None = None
        self.final_due: int | None = None
        self.pending: dict[str, Any] = {}
        self.videos: list[dict[str, Any]] = []

    @property
    def enabled(self) -> bool:
        return self.request is not None

    def tick(self, frames: int) -> None:
        """Called from the runner's loop with the frames so far: publish a request when one is due."""
        if self.request is None:
            return
        if self.next_due is None:  # the first multiple of --eval-every past where this (maybe resumed) run starts
            self.next_due = (frames // self.every + 1) * self.every
        if frames >= self.next_due:
            self.request["due"][DUE] = frames
            self.next_due = (frames // self.every + 1) * self.every

    def request_final(self, frames: int) -> None:
        """Ask for the final evaluation (served even though the stop flag is set)."""
        self.final_due = frames
        self.request["due"][FINAL] = 1  # before the frames: whoever sees the new frames also sees the flag
        self.request["due"][DUE] = frames

    @property
    def final_done(self) -> bool:
        return self.final_due is not None and self.pending.get("eval_frames", -1) >= self.final_due

    def receive(self, payload: dict[str, Any]) -> None:
        """An `eval` report: move its files into place, keep its numbers for the next record and its video for the
        metrics writer."""
        commit_outputs([tuple(pair) for pair in payload.get("staged", ())])
        self.pending = {k: payload[k] for k in RESULT_KEYS if k in payload}
        if payload.get("video"):
            self.videos.append({"frames": payload["eval_frames"], "video": payload["video"],
                                "gif": payload.get("gif")})

    def pop_results(self) -> dict[str, Any]:
        """The newest evaluation's `eval_*` values, once (an empty dict when none arrived since the last call)."""
        results, self.pending = self.pending, {}
        return results

    def pop_videos(self) -> list[dict[str, Any]]:
        videos, self.videos = self.videos, []
        return videos

    def discard_staged(self) -> None:
        """At the run's end: remove what evaluations that never reported (stopped or killed) staged."""
        if self.enabled:
            shutil.rmtree(os.path.join(self.run_dir, STAGING), ignore_errors=True)
