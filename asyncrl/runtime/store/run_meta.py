"""`checkpoints/meta.json`: what the run's model is built for, so `--resume` can refuse a checkpoint of another
env or model shape before any process starts (the runner has not imported torch at that point, so it opens none).

Written by the runner when a run starts afresh; read back by a `--resume`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
import numpy as np

from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.store.checkpoint import checkpoint_dir

META_NAME = "meta.json"


def describe_space(space: gym.spaces.Space) -> str:
    if isinstance(space, gym.spaces.Discrete):
        return f"Discrete({int(space.n)})"
    if isinstance(space, gym.spaces.Tuple):
        return f"Tuple({', '.join(describe_space(part) for part in space.spaces)})"
    return f"{type(space).__name__}{tuple(int(d) for d in space.shape)}"


def model_meta(cfg: Config, spec: EnvSpec) -> dict[str, Any]:
    """Everything that fixes the shapes of the model's parameters and buffers."""
    meta: dict[str, Any] = {
        "env": cfg.env,
        "obs_shape": [int(d) for d in spec.obs_shape],
        "obs_dtype": str(np.dtype(spec.obs_dtype)),
        "action_space": describe_space(spec.action_space),
    }
    if spec.is_dict:  # per key
        meta["obs_shape"] = {k.key: [int(d) for d in k.shape] for k in spec.obs_keys}
        meta["obs_dtype"] = {k.key: str(np.dtype(k.dtype)) for k in spec.obs_keys}
    if spec.is_dict or len(spec.obs_shape) != 3:  # image observations always use the CNN; these only shape the MLP
        meta.update(hidden_size=cfg.hidden_size, normalize_obs=cfg.normalize_obs)
    if cfg.encoder != MODEL_DEFAULTS["encoder"]:  # recorded when not the default (a run from before has neither)
        meta["encoder"] = cfg.encoder
    if cfg.activation != MODEL_DEFAULTS["activation"]:
        meta["activation"] = cfg.activation
    if cfg.rnn != MODEL_DEFAULTS["rnn"]:
        meta.update(rnn=cfg.rnn, rnn_size=cfg.rnn_size, rnn_layers=cfg.rnn_layers)
    return meta


# absent from meta.json when so (and in runs from before the setting)
MODEL_DEFAULTS = {"encoder": "auto", "activation": "tanh", "rnn": "none", "rnn_size": None, "rnn_layers": None}


def meta_path(run_dir: str) -> str:
    return os.path.join(checkpoint_dir(run_dir), META_NAME)


def write_meta(cfg: Config, spec: EnvSpec) -> None:
    path = meta_path(cfg.run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(model_meta(cfg, spec), f, indent=1)
    os.replace(path + ".tmp", path)


def read_meta(run_dir: str) -> dict[str, Any] | None:
    try:
        with open(meta_path(run_dir)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def check_resume(cfg: Config, spec: EnvSpec) -> None:
    """Raise ConfigError (one line, what to do) if the run's checkpoints cannot be loaded into this model."""
    saved = read_meta(cfg.run_dir)
    if saved is None:  # a run from before meta.json: the learner still refuses a mismatch when it loads
        return
    now = model_meta(cfg, spec)
    where = f"--resume: the checkpoints in {cfg.run_dir}"
    if saved.get("env") != now["env"]:
        raise ConfigError(f"{where} are for env {saved.get('env')!r}, not {now['env']!r}; resume with --env "
                          f"{saved.get('env')} or start a new --experiment")
    for key, what in (("obs_shape", "observation shape"), ("obs_dtype", "observation dtype"),
                      ("action_space", "action space")):
        if key in saved and saved[key] != now[key]:
            raise ConfigError(f"{where} were trained with {what} {_show(saved[key])} but env {cfg.env!r} now has "
                              f"{_show(now[key])}; start a new --experiment")
    for key, default in MODEL_DEFAULTS.items():  # the encoder and the recurrent core (absent: the defaults)
        if saved.get(key, default) != now.get(key, default):
            was, given = saved.get(key, default), now.get(key, default)
            raise ConfigError(f"{where} were trained with {_flag(key, was) if was is not None else 'no --rnn'}, "
                              f"which conflicts with {_flag(key, given) if given is not None else 'no --rnn'}: the "
                              f"model cannot change on resume; start a new --experiment")
    for key in ("hidden_size", "normalize_obs"):
        if key in saved and key in now and saved[key] != now[key]:
            raise ConfigError(f"{where} were trained with {_flag(key, saved[key])}, which conflicts with "
                              f"{_flag(key, now[key])}: the model's shape cannot change on resume; pass "
                              f"{_flag(key, saved[key])} or start a new --experiment")


def _show(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, list) else str(value)


def _flag(key: str, value: Any) -> str:
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return name if value else f"--no-{key.replace('_', '-')}"
    return f"{name} {value}"
