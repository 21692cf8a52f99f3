"""Whether this process may fork asyncrl's workers: `check_can_fork` before the engine starts, and
`check_env_left_cuda_alone` after the env was built to read its spaces. Torch-free (torch is looked at only
where it is imported already)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time


class ForkError(RuntimeError):
    """This process cannot fork asyncrl's workers safely; the message says what to do instead."""


def check_can_fork() -> None:
    """Refuse, with one line saying what to do, where forking the workers is unavailable or unsafe.

    The engine forks its workers (start method "fork") so they inherit the shared memory; it needs Linux
    (fork, memfd, PR_SET_PDEATHSIG). A fork is unsafe once this process has initialised CUDA (a forked child
    cannot use it) or started torch's CPU thread pool (OpenMP's pool does not survive a fork: the child's
    first parallel operation hangs), so both are refused. `torch.cuda.is_available()` and `device_count()`
    initialise the CUDA driver without setting `torch.cuda.is_initialized()`, so the driver library mapped in
    this process counts as initialised too (`cuda_driver_loaded`).
    """
    if sys.platform != "linux" or "fork" not in mp.get_all_start_methods():
        raise ForkError(f"asyncrl forks its worker processes and needs Linux (this is {sys.platform}); run it in "
                        f"a Linux machine, container or WSL2")
    if threading.current_thread() is not threading.main_thread():
        raise ForkError("asyncrl.train must be called from the main thread (it handles SIGINT/SIGTERM to stop "
                        "the run cleanly); call it there, or run asyncrl-train in a subprocess")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        raise ForkError("CUDA is already initialised in this process and forked workers cannot use it; start the "
                        "training before any CUDA work (e.g. in a fresh notebook kernel), or run asyncrl-train")
    if cuda_driver_loaded():
        raise ForkError(CUDA_DRIVER_LOADED)
    if "jax" in sys.modules:
        raise ForkError("JAX is already imported in this process and its runtime does not survive a fork (forked "
                        "workers that use it hang); start the training before any JAX import, run asyncrl-train "
                        "in a subprocess, or pass --serial")
    if torch is None:
        return
    if torch_threads_started():
        raise ForkError("torch has started its CPU thread pool in this process, which a forked worker cannot "
                        "use; start the training before any torch work (e.g. in a fresh notebook kernel or "
                        "script), or run asyncrl-train in a subprocess")


CUDA_DRIVER_LOADED = (
    "the CUDA driver is already loaded in this process (by torch.cuda.is_available() or device_count(), or by an "
    "env factory that touches CUDA when it is built to read the spaces), and forked workers cannot use CUDA; set "
    "PYTORCH_NVML_BASED_CUDA_CHECK=1 before importing torch (those calls then ask NVML instead), leave CUDA alone "
    "in the env factory until the env's first reset, or start the training before any CUDA call (a fresh "
    "notebook kernel)")


def cuda_driver_loaded(maps: str = "/proc/self/maps") -> bool:
    """True when the CUDA driver library (libcuda.so*) is mapped in this process: something initialised CUDA."""
    try:
        with open(maps) as f:
            return any(os.path.basename(line.rstrip("\n").split(maxsplit=5)[-1]).startswith("libcuda.so")
                       for line in f if "/" in line)
    except OSError:  # no procfs: nothing to tell
        return False


def check_env_left_cuda_alone(env: str) -> None:
    """After the env was built to read its spaces (`check_can_fork` passed before): refuse if that loaded
    the CUDA driver in this process."""
    if cuda_driver_loaded():
        raise ForkError(f"building the env {env!r} to read its spaces loaded the CUDA driver in this process, and "
                        f"forked workers cannot use CUDA; make the env factory leave CUDA alone until its first "
                        f"reset (each worker builds its own envs), or set PYTORCH_NVML_BASED_CUDA_CHECK=1 if it "
                        f"only calls torch.cuda.is_available()")


def torch_threads_started(timeout: float = 10.0) -> bool:
    """True when a forked child of this process cannot run a parallel torch operation (it hangs).

    That is the case once torch has used its OpenMP thread pool here: the pool's threads are not copied by a
    fork, and the child's first parallel region waits for them forever. Probed in a forked child, since no
    API says whether the pool exists; the probe takes milliseconds when the fork is safe.
    """
    import torch

    pid = os.fork()
    if pid == 0:  # the probe: one elementwise op large enough to run on every thread
        try:
            torch.ones(1 << 21).add_(1)
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return True

