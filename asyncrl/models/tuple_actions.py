"""Tuple actions: independent Discrete, MultiDiscrete and Box parts as one distribution over a flat vector.

The action is stored as one float32 vector, the parts one after another (an index for a Discrete part, one index
per component for a MultiDiscrete part, the values of a Box part); the policy output is the parts' logits and
Gaussian means one after another (`asyncrl.envs.base.ActionPart` gives both layouts). Log-probabilities and
entropies are sums over the parts, as Sample Factory's TupleActionDistribution.
"""

from __future__ import annotations

import math

import torch
from torch.distributions import Distribution

from asyncrl.envs.base import ActionPart
from asyncrl.models.categorical import MultiCategorical


def _choices(part: ActionPart) -> tuple[int, ...]:
    """A part's choices per component, as plain ints: a constant for torch.compile (`--compile`), which would
    otherwise trace the space's numpy array as data."""
    return part.nvec


# What torch.compiler.assume_constant_result sets, without importing torch's compiler (1.7 s) in eager runs
_choices._dynamo_marked_constant = True  # type: ignore[attr-defined]


class TupleDistribution(Distribution):
    """`policy_out` [N, num_actions] and the Box parts' `log_std` [gaussian dims] (None: the mode only)."""

    arg_constraints: dict = {}

    def __init__(self, policy_out: torch.Tensor, parts: tuple[ActionPart, ...], log_std: torch.Tensor | None):
        self.parts = parts
        self._zeros = policy_out.new_zeros(policy_out.shape[:-1])
        self.dists: list[tuple[ActionPart, object]] = []
        box = 0
        for part in parts:
            out = policy_out[..., part.out_offset:part.out_offset + part.out_width]
            if part.kind == "box":
                std = None if log_std is None else log_std[box:box + part.width]
                self.dists.append((part, (out, std)))
                box += part.width
            else:
                self.dists.append((part, MultiCategorical(out, _choices(part))))
        super().__init__(batch_shape=policy_out.shape[:-1], validate_args=False)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        total = self._zeros
        for part, dist in self.dists:
            a = actions[..., part.offset:part.offset + part.width]
            if part.kind == "box":
                mean, log_std = dist
                z = (a - mean) * torch.exp(-log_std)
                total = total + (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
            else:
                total = total + dist.log_prob(a.round().long())
        return total

    def entropy(self) -> torch.Tensor:
        total = self._zeros
        for part, dist in self.dists:
            if part.kind == "box":
                _, log_std = dist
                total = total + (0.5 * math.log(2 * math.pi * math.e) + log_std).sum()
            else:
                total = total + dist.entropy()
        return total

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 - torch's signature
        out = []
        for part, dist in self.dists:
            if part.kind == "box":
                mean, log_std = dist
                out.append(mean + log_std.exp() * torch.randn_like(mean))
            else:
                out.append(dist.sample().float())
        return torch.cat(out, dim=-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.cat([dist[0] if part.kind == "box" else dist.mode.float() for part, dist in self.dists], dim=-1)


def clip_boxes(actions: torch.Tensor, parts: tuple[ActionPart, ...]) -> torch.Tensor:
    """Actions with each Box part clipped to its bounds (index parts untouched)."""
    pieces = []
    for part in parts:
        a = actions[..., part.offset:part.offset + part.width]
        if part.kind == "box":
            low = torch.as_tensor(part.space.low, dtype=a.dtype, device=a.device)
            high = torch.as_tensor(part.space.high, dtype=a.dtype, device=a.device)
            a = torch.maximum(torch.minimum(a, high), low)
        pieces.append(a)
    return torch.cat(pieces, dim=-1)
