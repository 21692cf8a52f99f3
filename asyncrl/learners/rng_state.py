"""The process-wide random generators as plain data, for learner checkpoints that load with weights_only."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    """torch's, numpy's and Python's global generator states."""
    return {"torch_rng": torch.get_rng_state(), "numpy_rng": _numpy_rng_state(), "python_rng": random.getstate()}


def load_rng_state(state: dict) -> None:
    """Restore what `rng_state` saved (a checkpoint without it leaves the generators as they are)."""
    if "torch_rng" in state:
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(_numpy_rng_from(state["numpy_rng"]))
        random.setstate(_tuples(state["python_rng"]))


def _numpy_rng_state() -> list:
    """numpy's global RNG state as plain data (no ndarray), so that a checkpoint loads with weights_only."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _numpy_rng_from(saved) -> tuple:
    name, keys, pos, has_gauss, cached = saved
    return name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)


def _tuples(value):
    """random.setstate wants tuples where a round trip may have produced lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
