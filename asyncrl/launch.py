"""One way to start a training, shared by `asyncrl-train` and `asyncrl.train()`: take this rank's settings (under
torchrun), run the preflight (`asyncrl.preflight`: every check, the env spec made once), print what changed on
--resume, then build the engine from what the preflight prepared and run it in this process (with --serial: the
serial loop, `asyncrl.runtime.serial`, which forks nothing).

Torch-free, like the runner it starts (the serial loop imports torch itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from asyncrl.config import Config
from asyncrl.fork_safety import (  # noqa: F401 - their home before asyncrl.fork_safety; callers import them here
    CUDA_DRIVER_LOADED,
    ForkError,
    check_can_fork,
    check_env_left_cuda_alone,
    cuda_driver_loaded,
    torch_threads_started,
)
from asyncrl.preflight import preflight, require_cuda, validate  # noqa: F401 - validate, require_cuda: as above
from asyncrl.resolve import Resolution, resolution_of, resume_changes
from asyncrl.runtime.distributed.rank import for_this_rank


def run(settings: Config | Resolution, out: Callable[..., None] = print,
        callbacks: Iterable[Callable[[dict], Any]] = ()) -> tuple[int, str | None, Config]:
    """Check `settings` and train in this process: (exit code, why the run stopped, the settings it ran with: under
    torchrun this rank's, `asyncrl.runtime.distributed.rank`). `settings` is a Config, or a `Resolution` whose env
    specs and saved config.json are reused. `callbacks` see every metrics record, checkpoint and evaluation
    (asyncrl/runtime/plumbing/callbacks.py).

    Bad input raises ConfigError or EnvError before anything is created; an unusable process, ForkError.
    """
    resolution = settings if isinstance(settings, Resolution) else resolution_of(settings)
    given = resolution.config
    cfg, ranks = for_this_rank(given)  # under torchrun: this rank's seed, device, run dir (a new Config)
    # --serial under torchrun is refused by the preflight's validation; `given`'s device: a rank's auto may have
    # become a GPU its probe found
    prepared = preflight(cfg, resolution.specs, need_cuda=given.device.startswith("cuda"))
    for change in resume_changes(given, resolution.saved or {}):  # what the command line changed on --resume
        out(change, flush=True)
    if ranks is not None:
        ranks.announce(cfg)  # from here on every line this process prints starts with its rank
    if cfg.serial:
        from asyncrl.runtime.serial import SerialRun

        engine: Any = SerialRun(cfg, out, callbacks, spec=prepared.spec)
    else:
        from asyncrl.runtime.roles.runner import Runner

        engine = Runner(cfg, callbacks=callbacks, ranks=ranks, spec=prepared.spec)
    for line in scaling_lines(cfg):
        out(line, flush=True)
    processes = ("in this one process (--serial)" if cfg.serial else f"{cfg.policy_workers} policy worker(s)")
    remote = (f" + {cfg.remote_workers} remote groups x {cfg.remote_envs} envs on Ray at {cfg.ray}"
              if cfg.remote_workers else "")
    if cfg.remote_workers and not cfg.workers:
        processes = "acting on the remote nodes"
    out(f"asyncrl: {cfg.env} -> {cfg.run_dir} | {cfg.workers} workers x {cfg.envs_per_worker} envs{remote}, "
        f"{processes}, batch {cfg.batch_size}, rollout {cfg.rollout}", flush=True)
    return engine.run(), engine.book.stop_reason, cfg


def scaling_lines(cfg: Config) -> list[str]:
    """At every start: the effective batch, global batch and learning rate with the rule that produced it (one
    line), after the env count the machine hosts when --scale asked for more."""
    from asyncrl.scaling import scale_note, scaling_line, world_size

    world = world_size()
    note = scale_note(cfg.scale, cfg.workers, cfg.envs_per_worker, world)
    envs = cfg.workers * cfg.envs_per_worker + cfg.remote_workers * cfg.remote_envs
    line = scaling_line(envs=envs * world, rollout=cfg.rollout, epochs=cfg.epochs,
                        batch_size=cfg.batch_size, world=world, rule=cfg.lr_scaling,
                        reference=cfg.lr_reference_batch, lr_base=cfg.lr_base, lr=cfg.lr)
    return [note, line] if note else [line]
