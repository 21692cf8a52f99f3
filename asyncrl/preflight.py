"""One preflight between the resolved settings and the engine: every check a run needs, in one place and one
order, before anything is written or allocated; it returns what the engine is built from (`Prepared`).

In order: the settings themselves (`validate`), that this process may fork the workers, that a --device cuda
exists, the env's spec (made once per start: the resolution's `EnvSpecs`), that building it left CUDA alone, the
env's VectorEnv size, that --algo can train on the env, that the model builds for it (a user's --encoder), the run
directory (a --resume finds checkpoints, a fresh start does not overwrite a run, the train dir is writable), that a
resumed run's checkpoints fit the model, and that the trajectory buffers fit in RAM. Each refusal is one line
(ConfigError, EnvError or ForkError). `--print-config` runs it `dry`: see `preflight`.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from dataclasses import dataclass

from asyncrl.agents.registry import check_algo, check_algo_env
from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.registry import check_env_options, check_env_size
from asyncrl.fork_safety import check_can_fork, check_env_left_cuda_alone
from asyncrl.models.probe import check_model_env
from asyncrl.models.registry import StateLayout, check_model, state_layout
from asyncrl.runtime.store.checkpoint import list_checkpoints
from asyncrl.runtime.store.run_meta import check_resume
from asyncrl.spec_memo import EnvSpecs


@dataclass(frozen=True)
class Prepared:
    """What the preflight passed and the engine is built from: the settings, the env's spec and the model's
    per-env recurrent state (`asyncrl.models.registry.state_layout`)."""

    cfg: Config
    spec: EnvSpec
    layout: StateLayout


def preflight(cfg: Config, specs: EnvSpecs | None = None, *, dry: bool = False,
              need_cuda: bool | None = None) -> Prepared:
    """Check everything the run of `cfg` needs, before anything is written or allocated; `specs` are the
    resolution's (`asyncrl.resolve.Resolution.specs`), so the env is built at most once per start.

    `need_cuda` (default: `cfg.device` names cuda) asks for a CUDA device. `dry` (--print-config) leaves out what
    concerns the process rather than the settings, as nothing is forked (the fork checks; a user's --encoder is
    built here, not in a forked child; CUDA is probed in a subprocess), and the refusal to overwrite an existing
    run (printing its command line's settings overwrites nothing). Creates nothing either way: the engine's
    `prepare_run_dir` writes the run directory.
    """
    validate(cfg)
    warning = lag_warning(cfg)
    if warning:
        print(f"asyncrl: warning: {warning}", file=sys.stderr, flush=True)
    forks = not (cfg.serial or dry)
    if forks:
        check_can_fork()
    if cfg.device.startswith("cuda") if need_cuda is None else need_cuda:
        require_cuda(in_process=cfg.serial and not dry)
    spec = (specs or EnvSpecs()).get(cfg)
    if forks:
        check_env_left_cuda_alone(cfg.env)
    check_env_size(cfg, spec)  # a VectorEnv of a size of its own
    check_algo_env(cfg, spec)  # the learner's own needs: action space, replay memory
    check_model_env(cfg, spec, fork=forks)  # --encoder fits the env (a user's module)
    check_run_dir(cfg, fresh_may_exist=dry)
    if cfg.remote_workers and not dry:
        check_ray_address(cfg.ray)
    if cfg.resume:
        check_resume(cfg, spec)  # another env or model shape
    from asyncrl.runtime.roles.runner import check_memory  # the runner's module, torch-free

    check_memory(cfg, spec)
    return Prepared(cfg, spec, state_layout(cfg))


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """--ray HOST:PORT: a Ray head answers there (its GCS port), or one line on what to do."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray {address!r} is not HOST:PORT; give the address `ray start --head` printed, e.g. "
                          f"--ray 10.0.0.5:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}); start its head "
                          f"with `ray start --head --node-ip-address <private IP> --port {port}` (docs/ray.md)"
                          ) from None


def validate(cfg: Config) -> None:
    """Every check of the settings that needs nothing started: the config's own, that the env's backend takes
    the env options given, that `--algo` is a learner, and that `--rnn` and `--encoder` name a model part."""
    cfg.validate()
    check_env_options(cfg)
    check_algo(cfg.algo)
    check_model(cfg)


def lag_warning(cfg: Config) -> str | None:
    """The one-line warning for `--max-policy-lag 0` with asynchronous acting (forked workers or --serial, which
    acts two versions behind): every sample acted on before the newest update is dropped, most of the data."""
    from asyncrl.agents.registry import OFF_POLICY

    if cfg.max_policy_lag != 0 or cfg.deterministic or cfg.algo in OFF_POLICY:
        return None
    return ("--max-policy-lag 0 with asynchronous workers drops every sample acted on with weights an update old "
            "(most of them); give --deterministic for lockstep on-policy training, or a lag of 1 or more")


def check_run_dir(cfg: Config, fresh_may_exist: bool = False) -> None:
    """ConfigError (one line, what to do) for a --resume with no checkpoint, a fresh start over an existing run
    (unless `fresh_may_exist`), or a train dir that cannot be written; reads only, creates nothing."""
    if cfg.resume and not list_checkpoints(cfg.run_dir):
        raise ConfigError(f"--resume: no checkpoint to resume in {cfg.run_dir}; drop --resume to start afresh")
    if not cfg.resume and not fresh_may_exist and os.path.exists(os.path.join(cfg.run_dir, "metrics.jsonl")):
        raise ConfigError(f"experiment {cfg.run_dir} already exists; pass --resume to continue it "
                          f"or --experiment NAME to start a new one")
    problem = unwritable(cfg.run_dir)
    if problem:
        raise ConfigError(f"cannot write to train dir {cfg.run_dir} ({problem}); choose another with --train-dir")


def unwritable(path: str) -> str | None:
    """Why directory `path` could not be created or written to (an OS error's words), or None: it, or the
    nearest of its parents that exists, is a directory this process may write in."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return os.strerror(errno.ENOTDIR)
    if not os.access(path, os.W_OK | os.X_OK):
        return os.strerror(errno.EACCES)
    return None


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
