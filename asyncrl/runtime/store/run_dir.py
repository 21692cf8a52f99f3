"""The run directory, written once the preflight (`asyncrl.preflight`) passed: by either engine, before it starts."""

from __future__ import annotations

import os

from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.recovery.supervisor import clean_checkpoint_temps, clean_stale_shm
from asyncrl.runtime.store.run_meta import write_meta


def prepare_run_dir(cfg: Config, spec: EnvSpec, out=print) -> None:
    """Create the run directory, clear what a killed run left, and write config.json (and on a fresh start
    checkpoints/meta.json). ConfigError (one line) when the directory cannot be created."""
    try:
        os.makedirs(cfg.run_dir, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write to train dir {cfg.run_dir} ({exc.strerror}); "
                          f"choose another with --train-dir") from None
    stale = clean_stale_shm()
    if stale:
        out(f"asyncrl: removed {len(stale)} file(s) a killed run left in /dev/shm")
    clean_checkpoint_temps(cfg.run_dir)  # a save interrupted by a kill
    with open(os.path.join(cfg.run_dir, "config.json"), "w") as f:
        f.write(cfg.to_json())
    if not cfg.resume:
        write_meta(cfg, spec)
