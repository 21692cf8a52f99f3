"""The process-wide random generators as plain data, for learner checkpoints that load with weights_only."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    """torch's (CPU, and every CUDA device's once CUDA is in use), numpy's and Python's global generator states."""
    state = {"torch_rng": torch.get_rng_state(), "numpy_rng": _numpy_rng_state(), "python_rng": random.getstate()}
    if torch.cuda.is_initialized():  # a CUDA learner draws on the GPU (SAC's action samples)
        state["cuda_rng"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def load_rng_state(state: dict) -> None:
    """Restore what `rng_state` saved (a checkpoint without it leaves the generators as they are).

    The states become CPU byte tensors whatever device the checkpoint was mapped to. CUDA generators are restored
    where this process already uses CUDA (its model is there), on the devices both it and the checkpoint have;
    a CPU resume of a CUDA run leaves CUDA untouched.
    """
    if "torch_rng" in state:
        torch.set_rng_state(_byte_tensor(state["torch_rng"]))
        np.random.set_state(_numpy_rng_from(state["numpy_rng"]))
        random.setstate(_tuples(state["python_rng"]))
    saved = state.get("cuda_rng")
    if saved and torch.cuda.is_initialized():
        for index in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(_byte_tensor(saved[index]), index)


def _byte_tensor(saved) -> torch.Tensor:
    """`torch.set_rng_state` takes a CPU uint8 tensor; a checkpoint mapped to a GPU holds a CUDA one."""
    return torch.as_tensor(saved).to(device="cpu", dtype=torch.uint8)


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
