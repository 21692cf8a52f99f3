"""torch.compile for the hot paths (`--compile`): the on-disk cache, one way to compile, and the failure message.

Every compiled function is whole-graph (`fullgraph=True`): a graph break is an error at the first call, never
a silent fallback to eager. The learners' minibatches have one shape (static); the policy workers pad requests
to a few sizes and compile one graph with the row count dynamic (`asyncrl.agents.compiled_acting`). Inductor's
artefacts (its FX graph cache) go to `cache_dir()`, so a second run or a resume reloads them instead of compiling
again.
Importing this module does not import torch's compiler; `compile_fn` does, only when a run compiles.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
RECOMPILE_LIMIT = 16  # distinct shapes one compiled function may see (the padded request sizes, a few more)


class CompileError(RuntimeError):
    """torch.compile cannot take this model or update (a graph break, an unsupported op): one line for the user."""


def cache_dir() -> str:
    """Where inductor keeps compiled artefacts: $TORCHINDUCTOR_CACHE_DIR, else ~/.cache/asyncrl/inductor."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(CACHE_ENV) or os.path.join(base, "asyncrl", "inductor")


def prepare_compiler() -> None:
    """Point inductor at `cache_dir()` (unless the user set it), with its FX graph cache on, before it loads."""
    os.environ.setdefault(CACHE_ENV, cache_dir())
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    import torch._dynamo
    import torch._inductor.config

    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:  # no pool of compile subprocesses in every process
        torch._inductor.config.compile_threads = 1  # (each imports torch: seconds of start-up, cache hit or not)

    config = torch._dynamo.config
    config.allow_rnn = True  # the recurrent cores' weights live in torch RNN modules (their cells are traced)
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.7; either is there
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def compile_fn(fn: Callable, mode: str = "default", backend: str | Callable = "inductor",
               dynamic: bool | None = False) -> Callable:
    """`fn` compiled whole-graph, with static shapes unless `dynamic` is None (then the dimensions the caller
    marks dynamic are); `mode` is --compile-mode ("default" passes none); tests pass a cheaper `backend`
    (aot_eager, or a counting one)."""
    prepare_compiler()
    options: dict[str, Any] = {"fullgraph": True, "dynamic": dynamic, "backend": backend}
    if backend == "inductor" and mode != "default":
        options["mode"] = mode
    return torch.compile(fn, **options)


def first_call(what: str, call: Callable[[], Any]) -> float:
    """Run `call` (a compiled function's first, compiling call); its seconds. CompileError (one line) when torch
    cannot compile it."""
    t0 = time.monotonic()
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):  # the warm-up's draws leave the run's generators as they were
            call()
    except Exception as exc:  # noqa: BLE001 - dynamo and inductor raise many kinds; each is the same user error
        if isinstance(exc, KeyboardInterrupt):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileError(f"--compile: torch.compile cannot take {what} ({type(exc).__name__}: {message[:200]}); "
                           f"run without --compile") from None
    return time.monotonic() - t0


def graph_count() -> int:
    """Graphs dynamo has compiled in this process so far (tests check that a compiled path really compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 for `--precision bf16-all` (autocast over the whole forward), None otherwise."""
    return torch.bfloat16 if precision == "bf16-all" else None


def autocast(dtype: torch.dtype | None, device: torch.device) -> torch.autocast:
    """An autocast context in `dtype` on `device`'s type (disabled for None)."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
