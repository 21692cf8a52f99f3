"""One way to start a training, shared by `asyncrl-train` and `asyncrl.train()`: take this rank's settings (under
torchrun), validate, check that this process may fork, print what changed on --resume, then run the Runner in this
process (with --serial: the serial loop, `asyncrl.runtime.serial`, which forks nothing).

Torch-free, like the runner it starts (the serial loop imports torch itself).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from asyncrl.agents.registry import check_algo
from asyncrl.config import Config, ConfigError
from asyncrl.envs.registry import check_env_options, check_env_size
from asyncrl.models.probe import check_model_env
from asyncrl.models.registry import check_model
from asyncrl.resolve import resume_changes
from asyncrl.runtime.distributed.rank import for_this_rank


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
    """After the runner built the env to read its spaces (`check_can_fork` passed before): refuse if that loaded
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


def run(cfg: Config, out: Callable[..., None] = print,
        callbacks: Iterable[Callable[[dict], Any]] = ()) -> tuple[int, str | None, Config]:
    """Validate `cfg` and train in this process: (exit code, why the run stopped, the settings it ran with: under
    torchrun this rank's, `asyncrl.runtime.distributed.rank`). `callbacks` see every metrics record, checkpoint
    and evaluation (asyncrl/runtime/plumbing/callbacks.py).

    Bad input raises ConfigError or EnvError before anything is created; an unusable process, ForkError.
    """
    given = cfg
    cfg, ranks = for_this_rank(given)  # under torchrun: this rank's seed, device, run dir (a new Config)
    validate(cfg)  # --serial under torchrun is refused here
    if not cfg.serial:  # the serial loop forks nothing
        check_can_fork()
    for change in resume_changes(given):  # settings the command line changed from the saved run's
        out(change, flush=True)
    if given.device.startswith("cuda"):  # as given: a rank's auto may have become a GPU its probe found
        require_cuda(in_process=cfg.serial)
    if ranks is not None:
        ranks.announce(cfg)  # from here on every line this process prints starts with its rank
    if cfg.serial:
        from asyncrl.runtime.serial import SerialRun

        engine: Any = SerialRun(cfg, out, callbacks)  # builds the env once
    else:
        from asyncrl.runtime.roles.runner import Runner

        engine = Runner(cfg, callbacks=callbacks, ranks=ranks)  # builds the env once
        check_env_left_cuda_alone(cfg.env)
    check_env_size(cfg, engine.spec)  # a VectorEnv of a size of its own, before anything is written
    check_model_env(cfg, engine.spec, fork=not cfg.serial)  # --encoder fits the env (a user's module)
    for line in scaling_lines(cfg):
        out(line, flush=True)
    processes = ("in this one process (--serial)" if cfg.serial else f"{cfg.policy_workers} policy worker(s)")
    out(f"asyncrl: {cfg.env} -> {cfg.run_dir} | {cfg.workers} workers x {cfg.envs_per_worker} envs, "
        f"{processes}, batch {cfg.batch_size}, rollout {cfg.rollout}", flush=True)
    return engine.run(), engine.stop_reason, cfg


def validate(cfg: Config) -> None:
    """Every check of the settings that needs nothing started: the config's own, that the env's backend takes
    the env options given, that `--algo` is a learner, and that `--rnn` and `--encoder` name a model part."""
    cfg.validate()
    check_env_options(cfg)
    check_algo(cfg.algo)
    check_model(cfg)


def scaling_lines(cfg: Config) -> list[str]:
    """At every start: the effective batch, global batch and learning rate with the rule that produced it (one
    line), after the env count the machine hosts when --scale asked for more."""
    from asyncrl.scaling import scale_note, scaling_line, world_size

    world = world_size()
    note = scale_note(cfg.scale, cfg.workers, cfg.envs_per_worker, world)
    line = scaling_line(envs=cfg.workers * cfg.envs_per_worker * world, rollout=cfg.rollout, epochs=cfg.epochs,
                        batch_size=cfg.batch_size, world=world, rule=cfg.lr_scaling,
                        reference=cfg.lr_reference_batch, lr_base=cfg.lr_base, lr=cfg.lr)
    return [note, line] if note else [line]


def require_cuda(in_process: bool = False) -> None:
    """Probe CUDA in a subprocess: the runner itself must not initialise it (the workers are forked). With
    `in_process` (--serial, which forks nothing and starts no child) it is asked here."""
    if in_process:
        import torch

        available = torch.cuda.is_available()
    else:
        probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
        available = subprocess.run([sys.executable, "-c", probe]).returncode == 0
    if not available:
        raise ConfigError("--device cuda: no CUDA device is available; use --device auto or cpu")
