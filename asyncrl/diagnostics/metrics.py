"""Run metrics: one JSON object per report interval in metrics.jsonl, mirrored to TensorBoard scalars whose tags
are grouped by namespace (`tb_tags.py`: `episode/`, `losses/`, `policy/`, `perf/`, `sys/`, `health/`, `eval/`),
and to any extra sinks (W&B)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from asyncrl.diagnostics.tb_tags import tb_tag
from asyncrl.diagnostics.thread_errors import surfaced

STOP_RECORD = "stopped.json"  # written when a run closes its metrics (how it ended); removed while a run writes them


class MetricsWriter:
    """Appends to `RUN_DIR/metrics.jsonl` and writes TensorBoard events without importing torch."""

    def __init__(self, run_dir: str, sinks: Sequence[Any] = ()):
        os.makedirs(run_dir, exist_ok=True)
        self.sinks = list(sinks)  # e.g. W&B (`wandb_logger.py`): get the same tags and steps as TensorBoard
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.stop_path = os.path.join(run_dir, STOP_RECORD)
        self._last: dict[str, Any] = {}  # the newest record's run time and frames, for the stop record
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - kept open for the whole run
        try:  # a resumed run is running again: the stop record of its last launch no longer holds
            os.remove(self.stop_path)
        except FileNotFoundError:
            pass
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._tb = EventFileWriter(os.path.join(run_dir, "tb"), flush_secs=10)
        # Its writer thread keeps an error (a full disk) and raises it again at the next write, which the run reports
        # in one line: the thread's own end prints nothing (thread_errors.py).
        worker = getattr(getattr(self._tb, "_async_writer", None), "_worker", None)
        if isinstance(worker, threading.Thread):
            surfaced(worker)

    def write(self, record: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps(_finite(record), default=_jsonable, allow_nan=False) + "\n")
        self._last = {k: record[k] for k in ("time", "frames", "fatal") if k in record}
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tb_tag(k), simple_value=float(v)) for k, v in record.items()
                  if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and k != "time"]
        self._tb.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        for sink in self.sinks:
            sink.log({v.tag: v.simple_value for v in values}, step)

    def write_video(self, key: str, gif_path: str | None, video_path: str, step: int) -> None:
        """An evaluation video: the GIF as an animated TensorBoard image (what `add_video` writes, without
        moviepy), the mp4 to the sinks."""
        if gif_path:
            from PIL import Image
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary

            with open(gif_path, "rb") as f:
                data = f.read()
            with Image.open(gif_path) as gif:
                width, height = gif.size
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
            self._tb.add_event(Event(wall_time=time.time(), step=step,
                                     summary=Summary(value=[Summary.Value(tag=tb_tag(key), image=image)])))
        for sink in self.sinks:
            sink.video(tb_tag(key), video_path)

    def close(self) -> None:
        """Close metrics.jsonl, TensorBoard's file and the sinks, each even if one before it fails; then raise the
        first OSError (a full disk)."""
        errors = []
        for close in (self._file.close, self._write_stop_record, self._tb.close, *(sink.close for sink in self.sinks)):
            try:
                close()
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


    def _write_stop_record(self) -> None:
        """`stopped.json`: the wall time the run closed its metrics, and its last record's run time and frames (and
        error), so `asyncrl-diagnose` tells a run that ended from one still running."""
        with open(self.stop_path, "w") as f:
            json.dump({"stopped_at": time.time(), **_finite(self._last)}, f, default=_jsonable)


def read_stop_record(run_dir: str) -> dict[str, Any] | None:
    """The run's stop record (`MetricsWriter.close`), or None while it runs (or for a run from before it)."""
    try:
        with open(os.path.join(run_dir, STOP_RECORD)) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON: NaN and infinities become null (the alerts say what went wrong)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def _jsonable(x: Any) -> Any:
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """All records, oldest first; a line that does not parse (one being written right now) is skipped."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
