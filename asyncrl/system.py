"""Facts about the machine this process runs on: the CPU cores it may use, and the memory it may still allocate.

`os.cpu_count()` is the machine's cores. A process may run on fewer: its affinity mask (taskset, Slurm, a
container's cpuset) and a cgroup CPU quota (`docker --cpus`, Kubernetes CPU limits) both narrow it. Threads and
worker counts sized on the machine's cores oversubscribe such a process. Free RAM, likewise, is capped by a
cgroup memory limit.

A ground-floor module: it imports nothing from asyncrl, and neither torch nor (until memory is asked for) psutil.
"""

from __future__ import annotations

import math
import os

CGROUP_V2_MAX = "/sys/fs/cgroup/cpu.max"


def install_hint(extra: str) -> str:
    """How to install an optional extra: asyncrl is installed from its checkout (it is not on PyPI), so
    `pip install 'asyncrl[doom]'` would look for another package; `pip install -e '.[doom]'` in the checkout works."""
    return f"pip install -e '.[{extra}]' in the asyncrl checkout"

CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def affinity_cpus() -> int:
    """Cores in this process's affinity mask (all of the machine's where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cgroup_cpu_limit(v2_path: str = CGROUP_V2_MAX, v1_quota: str = CGROUP_V1_QUOTA,
                     v1_period: str = CGROUP_V1_PERIOD) -> float | None:
    """The cgroup's CPU quota in cores (`quota / period`), or None without a limit (or without cgroups)."""
    try:
        with open(v2_path) as f:
            quota, period = (f.read().split() + ["100000"])[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(v1_quota) as fq, open(v1_period) as fp:
            quota_us, period_us = int(fq.read()), int(fp.read())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """Cores this process may use: its affinity mask, capped by the cgroup quota (rounded up), at least 1."""
    cores = affinity_cpus()
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def local_world_size(environ: dict[str, str] | None = None) -> int:
    """Ranks torchrun started on this node (1 outside torchrun): they share the node's cores."""
    env = os.environ if environ is None else environ
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def available_memory() -> int:
    """Bytes this process may still allocate: free RAM, or less under a cgroup (container) memory limit."""
    import psutil

    available = psutil.virtual_memory().available
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            available = min(available, max(0, int(limit) - usage))
        break
    return available
