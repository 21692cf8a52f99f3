"""Seeding and determinism settings for the processes that import torch (learner, policy workers)."""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np
import torch

INITIAL_WEIGHTS_NAME = "initial_weights.sha256"


def seed_learner(seed: int) -> None:
    """Seed every generator the learner draws from: model initialisation (torch), minibatch order (numpy)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """One thread and deterministic kernels (CUDA's cuBLAS needs its workspace setting before it starts)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def weights_sha256(flat: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(flat, dtype=np.float32).tobytes()).hexdigest()


def write_initial_weights_checksum(run_dir: str, flat: np.ndarray) -> None:
    """`RUN_DIR/initial_weights.sha256`: equal for two fresh runs with the same --seed and model."""
    path = os.path.join(run_dir, INITIAL_WEIGHTS_NAME)
    with open(path + ".tmp", "w") as f:
        f.write(weights_sha256(flat) + "\n")
    os.replace(path + ".tmp", path)
