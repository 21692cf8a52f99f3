"""Exact pooling of running moments across data-parallel ranks.

Each rank's `RunningMeanStd` holds the pooled moments of the last synchronisation merged with its own samples
since. Averaging the ranks' (mean, var, count) only approximates the pooled moments (it ignores the spread
between the ranks' means), and Chan-merging the ranks' states would count the shared history once per rank.
Raw moments are additive, so the pooling here is exact: every rank all-reduces (sums), in float64, what it
added since the last synchronisation as ``[n, n * mean, n * (var + mean^2)]``, and adds the sum to the
synchronised state (Chan, Golub & LeVeque 1979: moments of a union from the parts'). All ranks end with the
moments of the concatenation of every rank's samples, identically.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from asyncrl.algo.normalizers import RunningMeanStd

__all__ = ["MomentSync", "moment_modules", "raw_moments", "set_raw_moments"]


def moment_modules(*roots: nn.Module | None) -> list[RunningMeanStd]:
    """Every RunningMeanStd inside `roots`, in a fixed (registration) order."""
    return [m for root in roots if root is not None for m in root.modules() if isinstance(m, RunningMeanStd)]


def raw_moments(stats: RunningMeanStd) -> torch.Tensor:
    """``[n, n * mean..., n * (var + mean^2)...]`` in float64, flat."""
    n = stats.count.double()
    mean, var = stats.mean.double().reshape(-1), stats.var.double().reshape(-1)
    return torch.cat([n.reshape(1), n * mean, n * (var + mean.square())])


def set_raw_moments(stats: RunningMeanStd, raw: torch.Tensor) -> None:
    """Load raw moments (as `raw_moments` gives them) into `stats`."""
    k = stats.mean.numel()
    n = raw[0]
    mean = raw[1:1 + k] / n
    var = (raw[1 + k:1 + 2 * k] / n - mean.square()).clamp_min(0.0)
    with torch.no_grad():
        stats.count.copy_(n.to(stats.count.dtype))
        stats.mean.copy_(mean.view(stats.mean.shape).to(stats.mean.dtype))
        stats.var.copy_(var.view(stats.var.shape).to(stats.var.dtype))


class MomentSync:
    """Pools `modules`' moments across a process group; create it when the ranks' moments are identical (after
    the broadcast of rank 0's state), then call `pool()` (or `delta()` / `apply(summed)` around an all-reduce
    of your own, to share one collective with other data)."""

    def __init__(self, modules: Iterable[RunningMeanStd]):
        self.modules = list(modules)
        self.synced = [raw_moments(m) for m in self.modules]

    @property
    def size(self) -> int:
        return sum(s.numel() for s in self.synced)

    def delta(self) -> torch.Tensor:
        """What this rank added since the last synchronisation, as one flat float64 vector (sum it over ranks)."""
        if not self.modules:
            return torch.zeros(0, dtype=torch.float64)
        return torch.cat([raw_moments(m) - s for m, s in zip(self.modules, self.synced)])

    def apply(self, summed: torch.Tensor) -> None:
        """Set every module to the synchronised moments plus the ranks' summed `delta()`s."""
        offset = 0
        for i, m in enumerate(self.modules):
            n = self.synced[i].numel()
            pooled = self.synced[i] + summed[offset:offset + n].to(self.synced[i])
            set_raw_moments(m, pooled)
            self.synced[i] = raw_moments(m)
            offset += n

    def pool(self, group: object = None) -> None:
        """All-reduce the deltas over `group` (torch.distributed) and apply them: identical moments on all ranks."""
        import torch.distributed as dist

        vector = self.delta()
        device = self.modules[0].mean.device if self.modules else torch.device("cpu")
        vector = vector.to(device)
        dist.all_reduce(vector, group=group)
        self.apply(vector)
