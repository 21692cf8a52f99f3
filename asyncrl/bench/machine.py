"""The machine a benchmark ran on: cores, CPU model, memory, load, torch version and device."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any


def usable_cpus() -> int:
    """Cores this process may run on: the affinity mask (containers, taskset), capped by a cgroup CPU quota."""
    from asyncrl.system import usable_cpus as cores

    return cores()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (runnable processes, all users)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


def device_name() -> str:
    """The machine's first CUDA device (`cuda (NAME)`), or `none`. Imports torch, so call it after forking any
    workers. Each record's own `device` says where its models ran."""
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "none"


def resolve_bench_device(name: str) -> str:
    """`auto` as asyncrl-train resolves it (cuda when present), else `name`."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine_info(with_device: bool = True) -> dict[str, Any]:
    import psutil

    info: dict[str, Any] = {
        "cpu_count": usable_cpus(),
        "cpu_model": cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg": load_average(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "ale_py": _version("ale-py"),
        "gymnasium": _version("gymnasium"),
    }
    if with_device:
        info["device"] = device_name()
    return info


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process and all its live descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
