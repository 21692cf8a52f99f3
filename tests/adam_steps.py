"""A few optimizer steps on a small model, the same for every optimizer class (tests/test_eager_adam.py, also in
the subprocess it starts)."""

from __future__ import annotations

import torch


def train_steps(opt_cls: type, steps: int = 6) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = opt_cls(model.parameters(), lr=3e-3, eps=1e-6)
    for i in range(steps):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(i))
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return model, opt
