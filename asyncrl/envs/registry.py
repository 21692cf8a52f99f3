"""Env names to `EnvSpec`s and `VecEnv`s, through one table of backends (`BACKENDS`) and the name resolution
they share.

Names: `atari_<rom>` (ale_py's C++ vector env), `doom_<scenario>` (VizDoom, the optional `doom` extra), `null`,
`gymnax:<id>`, `envpool:<task id>` (EnvPool, the `envpool` extra), `playground:<env>` (MuJoCo Playground),
`isaaclab:<task>` (Isaac Lab), `pettingzoo:<family>.<env>`, a registered gymnasium id, or `module:callable` where
the callable returns a `gymnasium.Env` (or a VectorEnv, or a multi-agent env). This module stays light: no torch, and no
backend module is imported until a name of its row is built (ale_py only for Atari names, or to suggest close
matches for an unknown name; vizdoom only for Doom names).

Every env is built through `make_env_spec(cfg)` and `make_vec_env(cfg, n, training=...)`, where `cfg` is a
`Config`, a mapping of Config fields (a settings dict being resolved) or an env name alone (the Config defaults);
keyword settings override it by field name (`make_vec_env("atari_pong", 2, max_episode_frames=400)`). The row
that matches the name says which Config fields its backend reads, so a caller never spells a backend's options.

A new backend is one module (its `VecEnv`, and the row's two builders `backend_spec` and `backend_vec`) plus one
`Backend` row in `BACKENDS`, above the catch-all gymnasium row: how its names are recognised, its module, the
Config fields its builders take (`options`, and `train_options` that only training envs get), and its preset
family (`asyncrl/presets.py`; None: chosen from the env's spaces).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.config import Config, ConfigError, parse_env_kwargs, parse_info_keys
from asyncrl.envs.base import EnvError, EnvSpec, VecEnv
from asyncrl.envs.doom import DOOM_PREFIX
from asyncrl.envs.names import (
    ATARI_PREFIX,
    ENVPOOL_PREFIX,
    GYMNAX_PREFIX,
    ISAACLAB_PREFIX,
    PETTINGZOO_PREFIX,
    PLAYGROUND_PREFIX,
    is_mujoco,
)

EnvSettings = Config | Mapping[str, Any] | str  # a Config, some of its fields by name, or an env name alone


@dataclass(frozen=True)
class Backend:
    """One row of `BACKENDS`: the env names it serves and the module that builds them.

    The module (imported on first use) defines `backend_spec(name, **options)`, which describes env `name`
    (making at most one env, and closing it), and `backend_vec(name, num_envs, training, render_mode, **options,
    **train_options)`, which makes `num_envs` copies. The options are Config fields by name, read from the caller's
    settings: `options` for every env, `train_options` only for training envs (evaluation and `asyncrl-enjoy` play
    with the backend's own defaults).
    """

    name: str
    matches: Callable[[str], bool]
    module: str  # where its VecEnv and its two builders live
    options: tuple[str, ...] = ()
    train_options: tuple[str, ...] = ()
    # its preset (asyncrl/presets.py:PRESETS), or a function of the name giving one; None: from the env's spaces
    family: str | Callable[[str], str | None] | None = None
    info_keys: bool = False  # --info-keys reads its step info

    @property
    def spec(self) -> Callable[..., EnvSpec]:
        """`backend_spec` of its module."""
        return importlib.import_module(self.module).backend_spec

    @property
    def vec(self) -> Callable[..., VecEnv]:
        """`backend_vec` of its module."""
        return importlib.import_module(self.module).backend_vec


def gymnax_family(name: str) -> str | None:
    """MinAtar's games get the `gymnax_minatar` preset (measured settings, ReLU units); the other gymnax ids are
    chosen from their spaces (`vector_batched`)."""
    return "gymnax_minatar" if name.endswith("-MinAtar") else None


# The first row whose `matches` accepts the name serves it; the last row takes every other name.
BACKENDS: list[Backend] = [
    Backend("null", lambda name: name == "null", "asyncrl.envs.null_env", family="vector"),
    Backend("doom", lambda name: name.startswith(DOOM_PREFIX), "asyncrl.envs.doom_backend",
            options=("doom_measurements",), family="doom"),
    Backend("atari", lambda name: name.startswith(ATARI_PREFIX), "asyncrl.envs.atari",
            train_options=("env_threads", "max_episode_frames"), family="atari"),
    Backend("gymnax", lambda name: name.startswith(GYMNAX_PREFIX), "asyncrl.envs.gymnax_env",
            options=("env_kwargs",), family=gymnax_family),  # JAX envs, one jitted batch per worker split
    Backend("envpool", lambda name: name.startswith(ENVPOOL_PREFIX), "asyncrl.envs.envpool_env",
            options=("env_kwargs", "workers", "worker_splits")),  # one synchronous EnvPool per worker split
    Backend("playground", lambda name: name.startswith(PLAYGROUND_PREFIX), "asyncrl.envs.playground_env",
            options=("env_kwargs",)),  # MuJoCo Playground's JAX envs, one jitted batch per worker split
    Backend("isaaclab", lambda name: name.startswith(ISAACLAB_PREFIX), "asyncrl.envs.isaaclab_env",
            options=("env_kwargs",)),  # Isaac Lab's torch vector envs, on their device
    Backend("pettingzoo", lambda name: name.startswith(PETTINGZOO_PREFIX), "asyncrl.envs.multi_agent",
            options=("env_kwargs",)),  # ParallelEnvs, an env column per agent
    Backend("mujoco", is_mujoco, "asyncrl.envs.gym_backend", options=("env_kwargs",), family="mujoco", info_keys=True),
    # a registered gymnasium id (batched where it has a vectorised implementation) or module:callable
    Backend("gymnasium", lambda name: True, "asyncrl.envs.gym_backend", options=("env_kwargs", "env_vectorization"),
            info_keys=True),
]


def backend_for(name: str) -> Backend:
    """The `BACKENDS` row that serves env `name`."""
    return next(b for b in BACKENDS if b.matches(name))


def check_env_size(cfg: Config, spec: EnvSpec) -> None:
    """EnvError (one line) when the env's VectorEnv always has another size than a worker split's env count, or a
    worker split's env columns are not whole instances of a multi-agent env."""
    from asyncrl.envs.multi_agent import check_agent_columns, check_self_play

    check_agent_columns(cfg.env, spec, cfg.envs_per_split)
    check_self_play(cfg.env, spec, cfg.self_play)
    if spec.fixed_num_envs and spec.fixed_num_envs != cfg.envs_per_split:
        raise EnvError(f"{cfg.env!r} returned a VectorEnv of {spec.fixed_num_envs} envs where {cfg.envs_per_split} "
                       f"were asked for; give the callable a num_envs argument, or set --envs-per-worker to "
                       f"{spec.fixed_num_envs} x --worker-splits")


def check_env_options(cfg: Config) -> None:
    """ConfigError (one line) for an env option the env's backend does not take."""
    backend = backend_for(cfg.env)
    if parse_info_keys(cfg.info_keys) and not backend.info_keys:
        raise ConfigError(f"--info-keys applies to gymnasium ids and module:callable envs, not {cfg.env!r}; drop it")
    if cfg.env_vectorization != "auto" and "env_vectorization" not in backend.options:
        raise ConfigError(f"--env-vectorization applies to gymnasium ids and module:callable envs, not {cfg.env!r}; "
                          f"drop it")
    if cfg.doom_measurements and "doom_measurements" not in backend.options:
        raise ConfigError(f"--doom-measurements applies to doom_<scenario> envs, not {cfg.env!r}; drop it")


def preset_family(name: str) -> str | None:
    """The preset env `name`'s backend always gets (atari, doom, vector, mujoco), or None: chosen from its spaces."""
    family = backend_for(name).family
    return family(name) if callable(family) else family


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING}
_FACTORIES = {f.name: f.default_factory for f in dataclasses.fields(Config)
              if f.default_factory is not dataclasses.MISSING}  # e.g. workers (from the usable cores)


def _default(name: str) -> Any:
    return _DEFAULTS[name] if name in _DEFAULTS else _FACTORIES[name]()


def _settings(cfg: EnvSettings, overrides: dict[str, Any]) -> Callable[[str], Any]:
    """Config field name -> its value: `overrides`, then `cfg`, then the Config default."""
    def value(name: str) -> Any:
        if name in overrides:
            return overrides[name]
        if isinstance(cfg, str):
            return cfg if name == "env" else _default(name)
        if isinstance(cfg, Mapping):
            return cfg[name] if name in cfg else _default(name)
        return getattr(cfg, name)

    return value


def _resolve(cfg: EnvSettings, overrides: dict[str, Any], training: bool) -> tuple[str, Backend, dict[str, Any]]:
    """(env name, its backend, the options its builders take), refusing --env-kwargs where it does not apply."""
    value = _settings(cfg, overrides)
    name = value("env")
    backend = backend_for(name)
    options: dict[str, Any] = {}
    for field in (*backend.options, *(backend.train_options if training else ())):
        options[field] = _env_kwargs(value(field)) if field == "env_kwargs" else value(field)
    if "env_kwargs" not in backend.options and _env_kwargs(value("env_kwargs")):
        raise EnvError(f"--env-kwargs applies to gymnasium ids and module:callable envs, not {name!r}; drop it")
    return name, backend, options


def _env_kwargs(value: str | dict[str, Any] | None) -> dict[str, Any]:
    """--env-kwargs as a dict: the Config's JSON text, or a mapping already."""
    return parse_env_kwargs(value) if isinstance(value, str) else dict(value or {})


def make_env_spec(cfg: EnvSettings, **settings: Any) -> EnvSpec:
    """Describe the env of `cfg` (a Config, a mapping of its fields, or an env name; `settings` override fields),
    creating at most one env (and closing it)."""
    name, backend, options = _resolve(cfg, settings, training=False)
    return backend.spec(name, **options)


def make_vec_env(cfg: EnvSettings, num_envs: int, *, training: bool = True, render_mode: str | None = None,
                 **settings: Any) -> VecEnv:
    """Create `num_envs` copies of the env of `cfg` (a Config, a mapping of its fields, or an env name; `settings`
    override fields), with the options its backend reads (`BACKENDS`). `training` affects Atari and Doom, and
    only training envs get a backend's `train_options` (Atari's --env-threads and --max-episode-frames);
    `render_mode` applies to registered gymnasium ids only (custom callables make their envs as they like)."""
    if num_envs < 1:
        raise EnvError(f"num_envs must be >= 1, got {num_envs}")
    name, backend, options = _resolve(cfg, settings, training)
    return backend.vec(name, num_envs, training, render_mode, **options)
