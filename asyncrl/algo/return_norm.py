"""Return normalisation for the learner: rewards divided by a running scale of the value targets.

Engstrom et al. 2020 ("Implementation Matters in Deep Policy Gradients", reward scaling) divide each reward by
the running std of a per-env discounted return accumulator ``R_t = gamma R_{t-1} + r_t``. asyncrl's learner
cannot keep such accumulators: a batch's columns are (slot, env) pairs and slots rotate between workers, so no
column belongs to one env across batches, and an accumulator restarted at every trajectory sees at most
``rollout`` rewards (16 steps against a 100-step horizon at gamma 0.99), which underestimates the scale badly.

The V-trace targets ``v_s`` already are full-horizon (bootstrapped) estimates of the discounted return at every
sample, so this module tracks them instead (PopArt-lite; van Hasselt et al. 2016, "Learning values across many
orders of magnitude", without the output-preserving weight update): the learner divides rewards by ``scale``,
the value head learns returns in those units, and after each batch the raw targets (``v_s x scale``) update
the running moments. ``scale`` is the root mean square ``sqrt(var + mean^2)`` of the raw targets, not their
centred std: returns that hardly vary (CartPole's plateau near 1 / (1 - gamma)) would give a std near 0 and
blow the rewards up, while the RMS brings the targets to unit magnitude either way. The scale is read once
per batch and held for all its epochs; it moves slowly (a count-weighted running average), which is what lets
the head follow without PopArt's weight correction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from asyncrl.algo.normalizers import RunningMeanStd

__all__ = ["ReturnNormalizer"]


class ReturnNormalizer(nn.Module):
    """Running RMS of the raw V-trace targets; ``scale`` is the divisor for rewards (1.0 before any update).

    Its state is the buffers of a RunningMeanStd (``state_dict()``-able, pooled exactly across data-parallel
    ranks by `asyncrl.algo.moment_sync`).
    """

    def __init__(self, min_scale: float = 1e-4, max_scale: float = 1e6) -> None:
        super().__init__()
        self.moments = RunningMeanStd(())
        self.min_scale, self.max_scale = min_scale, max_scale

    @property
    def scale(self) -> float:
        """sqrt(var + mean^2) of the raw targets seen, clamped to [min_scale, max_scale]; 1.0 before any."""
        if float(self.moments.count) < 1.0:
            return 1.0
        rms = float((self.moments.var + self.moments.mean.square()).sqrt())
        return min(max(rms, self.min_scale), self.max_scale)

    @torch.no_grad()
    def update(self, targets: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> None:
        """Fold in a batch's V-trace targets, computed on rewards divided by `scale` (masked-out ones left out)."""
        raw = targets.detach().double() * scale
        if mask is not None:
            raw = raw[mask.bool()]
        self.moments.update(raw.reshape(-1))

    def observer(self, scale: float) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """The `on_targets(v_s, mask)` callback for `appo_loss` that folds targets computed at `scale` in."""
        return lambda targets, mask: self.update(targets, scale, mask)
