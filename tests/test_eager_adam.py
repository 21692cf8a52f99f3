"""The learners' Adam: torch's arithmetic and checkpoints, without loading torch's compiler at start-up."""

from __future__ import annotations

import copy
import subprocess
import sys

import torch

from asyncrl.agents.eager import Adam
from tests.adam_steps import train_steps


def _fused_adam(params, **kwargs) -> torch.optim.Adam:  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, fused=True, **kwargs)


def test_same_updates_and_state_as_torch_adam() -> None:
    """Bit for bit torch's fused Adam (ours fuses by default), and torch's per-tensor Adam to float rounding."""
    ours, ours_opt = train_steps(Adam)
    assert ours_opt.defaults["fused"]
    ref, ref_opt = train_steps(_fused_adam)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), ref.parameters()))
    a, b = ours_opt.state_dict(), ref_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for k in b["state"]:
        assert all(torch.equal(a["state"][k][name], b["state"][k][name]) for name in b["state"][k])
    per_tensor, _ = train_steps(torch.optim.Adam)
    for a, b in zip(ours.parameters(), per_tensor.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    _, explicit = train_steps(lambda params, **kwargs: Adam(params, foreach=True, **kwargs))
    assert not explicit.defaults["fused"]  # an explicit choice is kept


def test_loads_a_torch_adam_checkpoint_and_continues_identically() -> None:
    ref, ref_opt = train_steps(torch.optim.Adam, steps=3)
    ours = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ours.load_state_dict(ref.state_dict())
    ours_opt = Adam(ours.parameters(), lr=3e-3, eps=1e-6)
    ours_opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # not sharing the moments
    for model, opt in ((ours, ours_opt), (ref, ref_opt)):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), ref.parameters()))


def test_a_learner_trains_without_loading_the_compiler() -> None:
    """The APPO and SAC learners' construction, a step and a state_dict leave torch._dynamo unimported."""
    code = """
import sys
import torch
from tests.adam_steps import train_steps
from asyncrl.agents.eager import Adam
_, opt = train_steps(Adam)
opt.load_state_dict(opt.state_dict())
log_alpha = torch.zeros(1, requires_grad=True)
alpha_opt = Adam([log_alpha], lr=1e-3)
(log_alpha * 2).sum().backward()
alpha_opt.step()
print("dynamo loaded:", "torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "dynamo loaded: False" in out.stdout
