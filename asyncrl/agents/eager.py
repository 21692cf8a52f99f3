"""Adam without torch's compiler: keeps `torch._dynamo` from loading in learner processes, which never compile.

Torch's optimisers import `torch._dynamo` on their first construction and at every `step()` (to mark graph
breaks and "do not trace" regions for torch.compile). Loading it costs about 1.7 s of CPU, more than `import
torch`, and sits on every run's start-up path (the learner is ready only after it). `Adam` here is torch's Adam
with the same state, checkpoints and arithmetic; its `step()` runs torch's own update function directly, under
`no_grad`, and the "do not trace" wrappers are pointed at the functions they wrap (what they do themselves after
their first call). Where a torch version lays these out differently, each piece falls back to torch's path.
"""

from __future__ import annotations

import torch
from torch.optim import adam as _adam

_RAW_STEP = getattr(torch.optim.Adam.step, "__wrapped__", None)  # Adam.step without its grad-mode wrapper


def _probe() -> None:
    """Wrapped like torch's lazily-disabled functions: its wrapper's code object is theirs."""


def _point_lazy_wrappers() -> None:
    """Tell torch's `_disable_dynamo` wrappers (optimiser construction, state_dict, the functional update) to call
    their function directly instead of importing the compiler to wrap it on the first call."""
    wrapper_code = torch._disable_dynamo(_probe).__code__
    candidates = [getattr(_adam.adam, "__wrapped__", None)]
    for cls in (torch.optim.Optimizer, torch.optim.Adam):
        candidates += [getattr(attr, "__func__", attr) for attr in vars(cls).values()]
    # The functional update is wrapped twice (fallback, then disable): its disabled function is found by closure.
    candidates += [cell.cell_contents for cell in getattr(_adam.adam, "__closure__", None) or ()]
    for fn in candidates:
        inner = getattr(fn, "__wrapped__", None)
        if getattr(fn, "__code__", None) is wrapper_code and inner is not None:
            if getattr(inner, "__dynamo_disable", None) is None:
                inner.__dynamo_disable = inner

_point_lazy_wrappers()


class Adam(torch.optim.Adam):
    """torch.optim.Adam, stepped without loading torch's compiler."""

    def step(self, closure=None):  # type: ignore[override]
        if _RAW_STEP is None or self.defaults.get("differentiable"):
            return super().step(closure)
        with torch.no_grad():
            return _RAW_STEP(self, closure)
