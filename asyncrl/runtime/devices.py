"""Device selection shared by the learner and the policy workers."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; `cuda` without a GPU is a user error, reported by the CLI first."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
