"""The run directory, written once the preflight (`asyncrl.preflight`) passed: by either engine, before it starts."""

from __future__ import annotations

import os
import re

import psutil

from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.store.checkpoint import checkpoint_dir
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


_PYM = re.compile(r"pym-(\d+)-")


def clean_stale_shm(shm: str = "/dev/shm") -> list[str]:
    """Remove multiprocessing arena files that dead processes left in /dev/shm; return their names.

    faster-fifo's queues live in multiprocessing arenas: a file named `pym-<pid>-*` is created in /dev/shm and
    unlinked at once, so one survives only if its creator was killed in between. Ours are all anonymous.
    """
    removed = []
    try:
        names = os.listdir(shm)
    except OSError:
        return removed
    for name in names:
        match = _PYM.match(name)
        path = os.path.join(shm, name)
        try:
            if not match or psutil.pid_exists(int(match.group(1))) or os.stat(path).st_uid != os.getuid():
                continue
            os.remove(path)
            removed.append(name)
        except OSError:
            continue
    return removed


def clean_checkpoint_temps(run_dir: str) -> list[str]:
    """Remove the temp files of a checkpoint save that a killed learner never finished; return their names."""
    folder = checkpoint_dir(run_dir)
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".tmp")]
    except OSError:
        return []
    for name in names:
        try:
            os.remove(os.path.join(folder, name))
        except OSError:
            continue
    return names
