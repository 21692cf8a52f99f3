"""Categorical heads over one flat logit vector: a product of categoricals (MultiDiscrete and Tuple parts) and
Gumbel-max sampling. Pure tensor maths, shared by the actor-critic and the Tuple distribution."""

from __future__ import annotations

import numpy as np
import torch
from torch.distributions import Distribution

PAD_LOGIT = -1e9


class MultiCategorical(Distribution):
    """Independent categoricals over the components of a MultiDiscrete action, from one flat logit vector.

    The logits [N, sum(nvec)] are laid out into a padded [N, k, max(nvec)] block, so every operation is one
    vectorised call over all components: log-probs and entropies are sums over components. The padding is a
    large finite negative logit (probability 0), not -inf, which would make 0 * -inf = NaN in the gradients.
    """

    arg_constraints: dict = {}

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        index, mask = _component_layout(nvec, logits.device)
        padded = logits[..., index].masked_fill(~mask, PAD_LOGIT)
        self.mask = mask
        self.log_probs = torch.log_softmax(padded, dim=-1)  # [N, k, m]
        super().__init__(batch_shape=logits.shape[:-1], validate_args=False)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """actions [N, k] (component indices) -> [N]."""
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        plogp = torch.where(self.mask, self.log_probs.exp() * self.log_probs, torch.zeros((), device=self.mask.device))
        return -plogp.sum((-2, -1))

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 - torch's signature
        return gumbel_argmax(self.log_probs)

    @property
    def mode(self) -> torch.Tensor:
        return self.log_probs.argmax(-1)


def _component_layout(nvec: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each component j and choice p < nvec[j]: the flat logit index (0 on padding) and a validity mask."""
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    choices = np.arange(max(nvec))
    mask = choices[None, :] < np.asarray(nvec)[:, None]
    index = np.where(mask, offsets[:, None] + choices[None, :], 0)
    return torch.as_tensor(index, device=device), torch.as_tensor(mask, device=device)


def gumbel_argmax(logp: torch.Tensor) -> torch.Tensor:
    """One sample per row of log-probabilities [..., n] (Gumbel-max: argmax of logp - log(Exp(1)))."""
    noise = torch.empty_like(logp).exponential_().log_()
    return (logp - noise).argmax(dim=-1)


