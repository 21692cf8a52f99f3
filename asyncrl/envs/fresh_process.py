"""Describing an env in a fresh interpreter, so its heavy runtime (JAX, Isaac Sim, CUDA) never loads in the process
that asks: rollout workers fork from it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

from asyncrl.envs.base import EnvError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout asyncrl is in


def jax_cpu_env() -> dict[str, str]:
    """The child's environment for a JAX env: JAX on the CPU, this checkout importable."""
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}


def described_in_child(code: str, payload: Any, what: str, timeout: float, doing: str = "describing it",
                       env: dict[str, str] | None = None) -> Any:
    """Run `code` (it reads the pickled `payload` from stdin and writes a pickled ("ok", value) or ("error",
    message)) in a fresh interpreter; the value, or a one-line EnvError naming `what` cannot be made."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(payload), capture_output=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EnvError(f"cannot make {what}: {doing} took over {timeout:.0f} s") from None
    if proc.returncode != 0 or not proc.stdout:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {proc.returncode}"]
        raise EnvError(f"cannot make {what}: {lines[-1]}")
    status, value = pickle.loads(proc.stdout)
    if status == "error":
        raise EnvError(value)
    return value
