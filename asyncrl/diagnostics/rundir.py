"""Reading a run directory for the offline tools (diagnose, plot, enjoy); bad input is a one-line error."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from asyncrl.diagnostics.metrics import read_metrics, read_stop_record


class RunDirError(ValueError):
    """Not a usable run directory; the CLIs print it as one line and exit with code 2."""


@dataclass
class RunData:
    path: str
    records: list[dict[str, Any]]
    config: dict[str, Any]
    stopped: dict[str, Any] | None = None  # the stop record (`stopped.json`); None while the run runs

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def metrics_age_s(self) -> float:
        """Seconds since metrics.jsonl was last written."""
        import time

        return time.time() - os.path.getmtime(os.path.join(self.path, "metrics.jsonl"))


def require_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise RunDirError(f"no run directory {path}")
    return path


def load_run(path: str) -> RunData:
    """Records (oldest first) and config of the run in `path`."""
    require_dir(path)
    if not os.path.exists(os.path.join(path, "metrics.jsonl")):
        raise RunDirError(f"{path} has no metrics.jsonl; pass a run directory (TRAIN_DIR/EXPERIMENT)")
    try:
        records = read_metrics(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"cannot read {path}/metrics.jsonl: {exc}") from None
    if not records:
        raise RunDirError(f"{path}/metrics.jsonl has no records yet; wait for the first report")
    config: dict[str, Any] = {}
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError):
        pass
    return RunData(path, records, config, read_stop_record(path))
