"""Per-process memory/CPU (psutil) and GPU utilisation (nvidia-smi) sampled by the runner; no torch here."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

import psutil

MB = 2**20


def process_type(name: str) -> str:
    """`rollout-3` -> `rollout`; `learner` -> `learner`."""
    return name.split("-", 1)[0]


class ProcessSampler:
    """RSS and CPU% of the runner and its named children. CPU% is over the time since the previous sample
    (None at a process's first sample), summed over threads, so a process can exceed 100%."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def _get(self, pid: int) -> tuple[psutil.Process, bool]:
        """The process, and whether it was sampled before."""
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
            return proc, False
        return proc, True

    def sample(self, pids: Mapping[str, int | None]) -> dict[str, dict[str, float | None]]:
        """{name: {"rss_mb", "cpu"}} for every live process in `pids` plus the runner itself, and
        `children-<name>` for the processes a named one started (VizDoom engines, a duel's players): the run's
        own work, which the machine's CPU would otherwise book to other jobs."""
        out: dict[str, dict[str, float | None]] = {}
        live: set[int] = set()
        for name, pid in {"runner": psutil.Process().pid, **pids}.items():
            if pid is None:
                continue
            try:
                proc, seen = self._get(pid)
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    out[name] = {"rss_mb": round(proc.memory_info().rss / MB, 1),
                                 "cpu": round(cpu, 1) if seen else None}
                live.add(pid)
                children = proc.children(recursive=True) if name != "runner" else []
            except psutil.Error:  # exited between the listing and the sample
                continue
            if children:
                out[f"children-{name}"] = self._sum(children, live)
        self._procs = {pid: p for pid, p in self._procs.items() if pid in live}
        return out

    def _sum(self, procs: list[psutil.Process], live: set[int]) -> dict[str, float | None]:
        """RSS and CPU% summed over `procs` (CPU over those sampled before; None when none was)."""
        rss, cpu, any_seen = 0.0, 0.0, False
        for child in procs:
            try:
                proc, seen = self._get(child.pid)
                with proc.oneshot():
                    percent = proc.cpu_percent(None)
                    rss += proc.memory_info().rss / MB
                live.add(child.pid)
            except psutil.Error:
                continue
            if seen:
                cpu, any_seen = cpu + percent, True
        return {"rss_mb": round(rss, 1), "cpu": round(cpu, 1) if any_seen else None}


def summarize(procs: Mapping[str, Mapping[str, float | None]]) -> dict[str, float]:
    """Flat totals per process type (`rss_mb_rollout`, `cpu_learner`, ...), `rss_mb_total` and `cpu_total`
    (CPU totals only over processes with a CPU reading)."""
    out: dict[str, float] = {"rss_mb_total": round(sum(p["rss_mb"] or 0.0 for p in procs.values()), 1)}
    for name, p in procs.items():
        kind = process_type(name)
        out[f"rss_mb_{kind}"] = round(out.get(f"rss_mb_{kind}", 0.0) + (p["rss_mb"] or 0.0), 1)
        if p["cpu"] is not None:
            out[f"cpu_{kind}"] = round(out.get(f"cpu_{kind}", 0.0) + p["cpu"], 1)
            out["cpu_total"] = round(out.get("cpu_total", 0.0) + p["cpu"], 1)
    return out


def gpu_ids(device: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The nvidia-smi ids of the GPU a run's `--device` uses (`cuda:N` or `cuda`/`auto`: CUDA device N or 0),
    through CUDA_VISIBLE_DEVICES where it is set (its N-th entry, an index or a UUID); [] for the CPU or when
    no GPU is visible. nvidia-smi numbers GPUs in PCI order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID
    (and, by default, on machines with identical GPUs)."""
    if device == "cpu":
        return []
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(index)]
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    return [entries[index]] if index < len(entries) else []


class GpuSampler:
    """`nvidia-smi --query-gpu` when the binary exists; disables itself after the first failure.

    With `device` (the run's `--device`), only the GPU that device is (`gpu_ids`), so a run on one GPU of a
    shared machine reports its own utilisation; without it, every GPU.
    """

    QUERY = "utilization.gpu,memory.used,memory.total"

    def __init__(self, enabled: bool = True, device: str | None = None) -> None:
        self.ids = gpu_ids(device) if device is not None else None
        self.binary = shutil.which("nvidia-smi") if enabled and self.ids != [] else None

    def command(self) -> list[str]:
        ids = [f"--id={','.join(self.ids)}"] if self.ids else []
        return [str(self.binary), f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", *ids]

    def sample(self) -> dict[str, float]:
        """{"gpu_util", "gpu_mem_mb", "gpu_mem_total_mb"} averaged/summed over the GPUs sampled, or {}."""
        if self.binary is None:
            return {}
        try:
            out = subprocess.run(self.command(), capture_output=True, text=True, timeout=5, check=True).stdout
            rows = [[float(x) for x in line.split(",")] for line in out.strip().splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError, ValueError):
            self.binary = None
            return {}
        if not rows:
            return {}
        return parse_rows(rows)


def parse_rows(rows: list[list[float]]) -> dict[str, float]:
    return {
        "gpu_util": round(sum(r[0] for r in rows) / len(rows), 1),
        "gpu_mem_mb": round(sum(r[1] for r in rows), 1),
        "gpu_mem_total_mb": round(sum(r[2] for r in rows), 1),
    }
