"""Reading the learner's published weights into a local model (the policy workers and the evaluator)."""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.models.actor_critic import flat_state
from asyncrl.shm import SharedWeights


class WeightsReader:
    """Keeps a local model in sync with the learner's published weights."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights):
        self.model, self.weights = model, weights
        self.tensors = flat_state(model)
        self.scratch = np.empty(sum(t.numel() for t in self.tensors), dtype=np.float32)
        self.version = 0

    def refresh(self) -> bool:
        """Load newer weights if there are any; True if the model changed."""
        if self.weights.version == self.version:
            return False
        version = self.weights.read_into(self.scratch)
        if version is None:
            return False
        src = torch.from_numpy(self.scratch)
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                t.copy_(src[offset:offset + t.numel()].view_as(t), non_blocking=True)
                offset += t.numel()
        self.version = version
        return True
