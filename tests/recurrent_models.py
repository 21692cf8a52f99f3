"""User encoders for `--encoder module:callable` (tests/test_recurrent.py puts this folder on PYTHONPATH).

A factory takes (obs_shape, hidden_size) and returns a torch.nn.Module mapping a batch of raw observations to
float features [N, F].
"""

from __future__ import annotations

import math

from torch import nn


def small_encoder(obs_shape: tuple[int, ...], hidden_size: int) -> nn.Module:
    """A one-layer ReLU encoder of 32 units on the flattened observation."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(obs_shape), 32), nn.ReLU())


def sequence_encoder(obs_shape: tuple[int, ...], hidden_size: int) -> nn.Module:
    """Does not fit: its output keeps a third dimension ([N, 2, F])."""
    return nn.Unflatten(1, (2, math.prod(obs_shape) // 2))


def broken_encoder(obs_shape: tuple[int, ...], hidden_size: int) -> nn.Module:
    raise RuntimeError("no encoder for you")


not_a_factory = 42
