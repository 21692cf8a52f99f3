"""Running statistics and squashing transforms for observation / return normalisation.

References: Chan, Golub & LeVeque 1979/1983, "Updating formulae and a pairwise algorithm for
computing sample variances" (parallel merge of moments); Hafner et al. 2023, "Mastering Diverse
Domains through World Models" (DreamerV3, eq. 1: symlog / symexp).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["FRAME_STATS_SAMPLES", "NORM_EPS", "OBS_CLIP", "STANDARDIZE_CHUNK_ACCELERATOR", "STANDARDIZE_CHUNK_CPU",
           "RunningMeanStd", "fold_frames", "frame_normalizer", "standardize_frames", "symexp", "symlog"]

OBS_CLIP = 5.0  # normalised observations are clipped to +-OBS_CLIP
NORM_EPS = 1e-8  # added to the variance before its square root
# Frames folded into the per-pixel statistics a learner batch (strided): a whole 1,024-frame Atari batch cost 0.27
# CPU-s an update with torch.var_mean, a quarter of the update itself; 256 of them as matrix products cost 8 ms.
FRAME_STATS_SAMPLES = 256
# Values standardised at a time (`standardize_frames`): on a CPU 9 Atari frames, about 1 MB in float32, which stays
# in cache; on an accelerator 256 MB, which bounds the float32 intermediate of a large batch.
STANDARDIZE_CHUNK_CPU, STANDARDIZE_CHUNK_ACCELERATOR = 2**18, 2**26


class RunningMeanStd(nn.Module):
    """Running mean and (population) variance of a stream of ``[..., *shape]`` batches.

    Statistics live in buffers (``mean``, ``var``, ``count``), so they follow ``.to(device)`` and
    appear in ``state_dict()``. They are kept in float64 by default: ``count`` easily exceeds the
    2**24 integers float32 represents exactly. ``count`` starts at ``eps`` (with mean 0, var 1) so
    the first merge is well defined.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(
        self,
        shape: int | Sequence[int] = (),
        eps: float = 1e-4,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=dtype, device=device))
        self.register_buffer("var", torch.ones(self.shape, dtype=dtype, device=device))
        self.register_buffer("count", torch.tensor(eps, dtype=dtype, device=device))

    @property
    def std(self) -> torch.Tensor:
        return self.var.sqrt()

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold in a batch whose trailing dimensions equal ``shape`` (leading dims are samples)."""
        nd = len(self.shape)
        if batch.dim() < nd or tuple(batch.shape[batch.dim() - nd :]) != self.shape:
            raise ValueError(f"batch shape {tuple(batch.shape)} does not end with {self.shape}")
        flat = batch.detach().to(device=self.mean.device, dtype=self.mean.dtype).reshape(-1, *self.shape)
        n = flat.shape[0]
        if n == 0:
            return
        batch_mean = flat.mean(dim=0)
        batch_var = flat.var(dim=0, unbiased=False)
        self.merge(batch_mean, batch_var, n)

    @torch.no_grad()
    def merge(
        self,
        other_mean: torch.Tensor | float,
        other_var: torch.Tensor | float,
        other_count: torch.Tensor | float,
    ) -> None:
        """Combine with another set of moments (Chan et al. parallel algorithm).

        With ``delta = mean_b - mean_a`` and ``n = n_a + n_b``::

            mean = mean_a + delta * n_b / n
            var  = (var_a * n_a + var_b * n_b + delta^2 * n_a * n_b / n) / n

        ``other_var`` is a population (biased) variance. Usable to sync statistics gathered by
        separate learners.
        """
        like = self.mean
        o_mean = torch.as_tensor(other_mean, dtype=like.dtype, device=like.device)
        o_var = torch.as_tensor(other_var, dtype=like.dtype, device=like.device)
        o_count = torch.as_tensor(other_count, dtype=like.dtype, device=like.device)
        if float(o_count) <= 0:
            return
        total = self.count + o_count
        delta = o_mean - self.mean
        new_mean = self.mean + delta * (o_count / total)
        m2 = self.var * self.count + o_var * o_count + delta.square() * (self.count * o_count / total)
        self.mean.copy_(new_mean.expand_as(self.mean))
        self.var.copy_((m2 / total).expand_as(self.var))
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float | None = OBS_CLIP, eps: float = NORM_EPS) -> torch.Tensor:
        """``clamp((x - mean) / sqrt(var + eps), -clip, clip)`` in ``x``'s dtype (``clip=None``: no clamp)."""
        mean = self.mean.to(device=x.device, dtype=x.dtype)
        var = self.var.to(device=x.device, dtype=x.dtype)
        y = (x - mean) / torch.sqrt(var + eps)
        if clip is not None:
            y = torch.clamp(y, -clip, clip)
        return y

    def denormalize(self, y: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
        """Inverse of :meth:`normalize` without clipping: ``y * sqrt(var + eps) + mean``."""
        mean = self.mean.to(device=y.device, dtype=y.dtype)
        var = self.var.to(device=y.device, dtype=y.dtype)
        return y * torch.sqrt(var + eps) + mean

    def extra_repr(self) -> str:
        return f"shape={self.shape}, count={float(self.count):.6g}"


def frame_normalizer(shape: Sequence[int]) -> RunningMeanStd:
    """Per-pixel statistics of uint8 frames whose prior (mean 0, std 255) makes standardising the CNN's usual
    pixels / 255 until the first batch's moments arrive: the first batch is not read with every bright pixel
    clipped to +OBS_CLIP."""
    stats = RunningMeanStd(shape)
    stats.var.fill_(255.0**2)
    return stats


def standardize_frames(frames: torch.Tensor, stats: RunningMeanStd, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``clamp((frames - mean) / sqrt(var + NORM_EPS), -OBS_CLIP, OBS_CLIP)``, computed in float32 as ``frames *
    scale + shift`` and stored as `dtype`, STANDARDIZE_CHUNK_* values at a time: on a CPU a few frames, so the float32
    intermediates stay in cache: 1,056 Atari frames to bf16 in 50-65 ms against 157 ms for whole-tensor
    operations, and less than the CNN's own uint8 -> bf16 / 255 (85 ms)."""
    scale = torch.rsqrt(stats.var + NORM_EPS)
    shift = (-stats.mean * scale).to(device=frames.device, dtype=torch.float32)
    scale = scale.to(device=frames.device, dtype=torch.float32)
    flat = frames.reshape(-1, *stats.shape)
    out = torch.empty(flat.shape, dtype=dtype, device=frames.device)
    chunk = STANDARDIZE_CHUNK_CPU if frames.device.type == "cpu" else STANDARDIZE_CHUNK_ACCELERATOR
    step = max(1, chunk // max(1, scale.numel()))
    work = out if dtype == torch.float32 else torch.empty((min(step, flat.shape[0]), *stats.shape),
                                                            dtype=torch.float32, device=frames.device)
    for lo in range(0, flat.shape[0], step):
        hi = min(lo + step, flat.shape[0])
        part = out[lo:hi] if work is out else work[: hi - lo]
        part.copy_(flat[lo:hi]).mul_(scale).add_(shift).clamp_(-OBS_CLIP, OBS_CLIP)
        if work is not out:
            out[lo:hi].copy_(part)
    return out.view(frames.shape)


@torch.no_grad()
def fold_frames(stats: RunningMeanStd, frames: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Fold the moments of at most FRAME_STATS_SAMPLES of `frames` [*lead, *shape] (every k-th of those where the
    boolean `mask` [*lead] is True; all when None). Only the sampled frames are copied, and both moments are
    matrix-vector products in float32 (two passes: the mean, then the squared deviations), 8x faster than
    ``torch.var_mean`` over the sample dimension on a CPU."""
    lead = frames.dim() - len(stats.shape)
    flat = frames.reshape(-1, *frames.shape[lead:])
    rows = mask.reshape(-1).nonzero().squeeze(1) if mask is not None else torch.arange(flat.shape[0])
    n = rows.shape[0]
    if not n:
        return
    rows = rows[:: max(1, -(-n // FRAME_STATS_SAMPLES))].to(flat.device)
    sample = flat.index_select(0, rows).reshape(rows.shape[0], -1).float()
    weights = torch.full((1, sample.shape[0]), 1.0 / sample.shape[0], device=sample.device)
    mean = (weights @ sample)[0]
    var = (weights @ sample.sub_(mean).square_())[0]
    stats.merge(mean.view(stats.shape), var.view(stats.shape), sample.shape[0])


def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * log(1 + |x|)`` (DreamerV3, eq. 1)."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) * (exp(|x|) - 1)``, the inverse of :func:`symlog`."""
    return torch.sign(x) * torch.expm1(torch.abs(x))
