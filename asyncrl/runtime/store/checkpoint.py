"""Checkpoints: atomic writes with a checksum, the last few kept, a corrupt latest one skipped on load.

Loading never runs code: checkpoints hold only tensors, plain containers and numbers (the config as a JSON
string, RNG states as tensors and lists), and are read with `torch.load(weights_only=True)`. A checkpoint that
needs any other pickled object (a class, a function: something that would run on unpickling) is refused.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import pickle
import re
from typing import Any

_NAME = re.compile(r"ckpt_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """No usable checkpoint (reported to the user as one line)."""


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def list_checkpoints(run_dir: str) -> list[str]:
    """Checkpoint files, newest (highest policy version) first."""
    paths = [p for p in glob.glob(os.path.join(checkpoint_dir(run_dir), "ckpt_*.pt")) if _NAME.search(p)]
    return sorted(paths, key=lambda p: int(_NAME.search(p).group(1)), reverse=True)


def save_checkpoint(run_dir: str, version: int, state: dict[str, Any], keep: int) -> str:
    """Write state as ckpt_<version>.pt atomically (temp file, fsync, rename) and prune old ones."""
    folder = checkpoint_dir(run_dir)
    os.makedirs(folder, exist_ok=True)
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    path = os.path.join(folder, f"ckpt_{version:010d}.pt")
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        with open(path + ".sha256.tmp", "w") as f:
            f.write(hashlib.sha256(payload).hexdigest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".sha256.tmp", path + ".sha256")
        os.replace(tmp, path)
        _fsync_dir(folder)  # the renames themselves survive a power cut
    finally:
        for leftover in (tmp, path + ".sha256.tmp"):
            if os.path.exists(leftover):
                os.remove(leftover)
    for old in list_checkpoints(run_dir)[keep:]:
        for f in (old, old + ".sha256"):
            if os.path.exists(f):
                os.remove(f)
    return path


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _verified_payload(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            payload = f.read()
        with open(path + ".sha256") as f:
            expected = f.read().strip()
    except OSError:
        return None
    return payload if hashlib.sha256(payload).hexdigest() == expected else None


def _set_aside(path: str) -> str:
    try:
        os.replace(path, path + ".corrupt")
    except OSError:
        return ""
    if os.path.exists(path + ".sha256"):
        os.replace(path + ".sha256", path + ".corrupt.sha256")
    return f", kept as {os.path.basename(path)}.corrupt"


def load_latest_checkpoint(run_dir: str, map_location: Any = "cpu", warn=print,
                           set_aside: bool = False) -> tuple[str, dict[str, Any]]:
    """The newest checkpoint whose checksum matches; corrupt ones are reported and skipped.

    With `set_aside` (a resuming run), corrupt ones are renamed to `*.corrupt`: otherwise one would keep
    shadowing the resumed run's new, lower-numbered saves, and pruning would delete those instead.
    """

    for path in list_checkpoints(run_dir):
        payload = _verified_payload(path)
        if payload is None:
            kept = _set_aside(path) if set_aside else ""
            warn(f"checkpoint {path} is truncated or corrupt (checksum mismatch){kept}; falling back to an older one")
            continue
        return path, _safe_load(path, payload, map_location)
    raise CheckpointError(f"no usable checkpoint in {checkpoint_dir(run_dir)}")


def _numpy_array_globals() -> list:
    """What an ndarray in a checkpoint of an earlier asyncrl (its numpy RNG state) needs: data, no code."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _safe_load(path: str, payload: bytes, map_location: Any) -> dict[str, Any]:
    """`torch.load` with `weights_only=True`; a checkpoint that needs arbitrary objects is refused, unrun."""
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"refused to load {path}: it needs an arbitrary pickled object{what}, which could "
                              f"run code; asyncrl checkpoints hold only tensors and plain data. Delete it if you "
                              f"did not write it") from None
