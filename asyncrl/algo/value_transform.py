"""Value transforms: the value head predicts h(V) instead of V (``--value-transform``).

With symlog (Hafner et al. 2023, DreamerV3, eq. 1-2) the head predicts ``symlog(V)``: V-trace reads
``symexp(head)`` as V, and the value loss compares the head with ``symlog(v_s)``, so returns of any magnitude
give targets of order log|V| and gradients that neither vanish nor explode. The identity transform ("none")
leaves everything as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.algo.losses import Weights, value_loss
from asyncrl.algo.normalizers import symexp, symlog

__all__ = ["ValueTransform", "TRANSFORMS"]

TRANSFORMS = ("none", "symlog")


@dataclass(frozen=True)
class ValueTransform:
    """``to_value``: head output -> V (for V-trace and bootstraps); ``to_head``: V -> head units (targets)."""

    name: str = "none"

    def __post_init__(self) -> None:
        if self.name not in TRANSFORMS:
            raise ValueError(f"value transform must be one of {TRANSFORMS} (got {self.name!r})")

    def to_value(self, head: torch.Tensor) -> torch.Tensor:
        return symexp(head) if self.name == "symlog" else head

    def to_head(self, value: torch.Tensor) -> torch.Tensor:
        return symlog(value) if self.name == "symlog" else value

    def loss(self, head: torch.Tensor, targets: torch.Tensor,
             mask: torch.Tensor | Weights | None = None) -> torch.Tensor:
        """0.5 x masked mean of (head - h(v_s))^2: the value loss in head units, targets detached."""
        return value_loss(head, self.to_head(targets.detach()), mask)
