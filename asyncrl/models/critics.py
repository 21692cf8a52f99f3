"""Networks for off-policy continuous control: an ensemble of Q-networks as one batched module, a
tanh-squashed Gaussian actor for Box action spaces, and the Polyak (soft) target update.

The ensemble stores each layer's weights of all N critics in one `[N, in, out]` tensor and evaluates the N
critics with one `torch.baddbmm` per layer, not a Python loop over critics: N = 10 (REDQ) costs about as many
kernel launches as N = 1. It takes vector observations; for pixels, put a shared encoder in front and feed
its features as `obs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from asyncrl.algo.squashed_gaussian import tanh_gaussian_log_prob

LOG_STD_RANGE = (-20.0, 2.0)  # as in the SAC reference implementation


class EnsembleLinear(nn.Module):
    """N independent affine maps: `[N, B, in] -> [N, B, out]`, each initialised like `nn.Linear`."""

    def __init__(self, num_members: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features))
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default: kaiming_uniform(a=sqrt(5)) and this bias bound
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """`x` [N, B, in] (or [len(members), B, in]: only those members are evaluated)."""
        if members is None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias.index_select(0, members), x, self.weight.index_select(0, members))


class QEnsemble(nn.Module):
    """N critics Q_i(s, a), each an MLP with ReLU hidden layers: `(obs [B, O], action [B, A]) -> [N, B]`."""

    def __init__(self, obs_dim: int, action_dim: int, num_critics: int = 2, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        self.num_critics = num_critics
        sizes = [obs_dim + action_dim, *hidden, 1]
        self.layers = nn.ModuleList(EnsembleLinear(num_critics, a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, obs: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values [N, B], or [len(members), B] of the critics indexed by `members` (the others are not run)."""
        x = torch.cat([obs.float().flatten(1), action.float()], dim=-1)
        if members is not None:
            members = members.to(x.device)
        x = x.unsqueeze(0).expand(self.num_critics if members is None else len(members), *x.shape)
        for i, layer in enumerate(self.layers):
            x = layer(x, members)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x.squeeze(-1)

    @torch.no_grad()
    def load_members(self, mlps: Sequence[nn.Sequential]) -> None:
        """Copy the weights of N separate `nn.Sequential` MLPs (Linear/ReLU, same sizes) into the ensemble."""
        if len(mlps) != self.num_critics:
            raise ValueError(f"expected {self.num_critics} MLPs, got {len(mlps)}")
        for k, mlp in enumerate(mlps):
            linears = [m for m in mlp if isinstance(m, nn.Linear)]
            for layer, linear in zip(self.layers, linears, strict=True):
                layer.weight[k].copy_(linear.weight.T)
                layer.bias[k, 0].copy_(linear.bias)


class TanhGaussianActor(nn.Module):
    """pi(a|s) for Box actions: `a = center + half_range * tanh(u)`, u ~ N(mu(s), sigma(s)), with exact log-probs."""

    def __init__(self, obs_dim: int, action_dim: int, low: Sequence[float] | torch.Tensor,
                 high: Sequence[float] | torch.Tensor, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.mean = nn.Linear(width, action_dim)
        self.log_std = nn.Linear(width, action_dim)
        low_t, high_t = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
        self.register_buffer("center", (high_t + low_t) / 2)
        self.register_buffer("half_range", (high_t - low_t) / 2)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action [B, A] `center + half_range tanh(mean)`: `forward(obs, deterministic=True)`'s
        action, without the log-prob (what an exported policy computes)."""
        return self.center + self.half_range * torch.tanh(self.mean(self.trunk(obs.float().flatten(1))))

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(action [B, A], log pi(action|obs) [B]); reparameterised, so gradients flow through the action."""
        features = self.trunk(obs.float().flatten(1))
        mean = self.mean(features)
        log_std = self.log_std(features).clamp(*LOG_STD_RANGE)
        pre_tanh = mean if deterministic else mean + log_std.exp() * torch.randn_like(mean)
        action = self.center + self.half_range * torch.tanh(pre_tanh)
        return action, tanh_gaussian_log_prob(mean, log_std, pre_tanh, self.half_range.expand_as(mean))


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """`target <- (1 - tau) target + tau source` for every parameter (one fused op); buffers are copied."""
    target_params = list(target.parameters())
    source_params = list(source.parameters())
    torch._foreach_lerp_(target_params, source_params, tau)
    for t, s in zip(target.buffers(), source.buffers()):
        t.copy_(s)
