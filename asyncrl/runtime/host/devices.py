"""Device selection shared by the learner and the policy workers (precision: `asyncrl.models.precision`)."""

from __future__ import annotations

import torch

from asyncrl.models.precision import cpu_has_native_bf16, resolve_precision

__all__ = ["cpu_has_native_bf16", "resolve_device", "resolve_precision"]  # precision: kept for existing imports


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present; `cuda` without a GPU is a user error, reported by the CLI first."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def configure_cuda_backends(device: torch.device, deterministic: bool = False) -> None:
    """On CUDA: cuDNN's autotuner (fixed batch shapes: the fastest convolution algorithm is found once) and TF32
    for float32 matmuls and convolutions, unless --deterministic (the autotuner's pick may differ between
    runs). Nothing on other devices."""
    if device.type != "cuda":
        return
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
