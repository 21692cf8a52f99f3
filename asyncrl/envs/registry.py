"""Env names to `EnvSpec`s and `VecEnv`s.

Names: `atari_<rom>` (ale_py's C++ vector env), `doom_<scenario>` (VizDoom, the optional `doom` extra), `null`,
a registered gymnasium id, or `module:callable` where the callable returns a `gymnasium.Env`. This module stays
light: no torch, ale_py is imported only for Atari names (or to suggest close matches for an unknown name) and
vizdoom only for Doom names.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from asyncrl.envs.base import EnvError, EnvSpec, VecEnv
from asyncrl.envs.doom import DOOM_PREFIX, doom_env_spec
from asyncrl.envs.gym_env import GymVecEnv, gym_env_spec
from asyncrl.envs.null_env import NULL_SPEC, NullVecEnv

ATARI_PREFIX = "atari_"
NAME_HELP = "Run with a registered gymnasium id, atari_<game>, doom_<scenario>, null, or module:callable"


def make_env_spec(name: str, env_kwargs: dict[str, Any] | None = None, *, doom_measurements: bool = False) -> EnvSpec:
    """Describe env `name` (made with `env_kwargs`), creating at most one env (and closing it)."""
    _check_kwargs_apply(name, env_kwargs)
    if name == "null":
        return NULL_SPEC
    if name.startswith(DOOM_PREFIX):
        return doom_env_spec(name, measurements=doom_measurements)
    if name.startswith(ATARI_PREFIX):
        env = make_vec_env(name, 1)
        try:
            return env.spec
        finally:
            env.close()
    env = _gym_factory(name, env_kwargs=env_kwargs)()
    try:
        return gym_env_spec(name, env)
    finally:
        env.close()


def make_vec_env(name: str, num_envs: int, *, training: bool = True, num_threads: int = 1,
                 render_mode: str | None = None, max_episode_frames: int | None = None,
                 env_kwargs: dict[str, Any] | None = None, doom_measurements: bool = False) -> VecEnv:
    """Create `num_envs` copies of env `name`; `training` affects Atari and Doom, `num_threads` and
    `max_episode_frames` (None: the backend's default) only Atari, `render_mode` only registered gymnasium ids
    (custom callables make their envs as they like), `env_kwargs` (constructor arguments) gymnasium ids and
    custom callables, `doom_measurements` (a Dict observation with the game variables) only Doom."""
    if num_envs < 1:
        raise EnvError(f"num_envs must be >= 1, got {num_envs}")
    _check_kwargs_apply(name, env_kwargs)
    if name == "null":
        return NullVecEnv(num_envs)
    if name.startswith(DOOM_PREFIX):
        from asyncrl.envs.doom import DoomVecEnv

        return DoomVecEnv(name, num_envs, training=training, measurements=doom_measurements)
    if name.startswith(ATARI_PREFIX):
        game = name[len(ATARI_PREFIX) :]
        if game not in _rom_ids():
            raise _unknown(name)
        from asyncrl.envs.atari import MAX_EPISODE_FRAMES, AtariVecEnv

        return AtariVecEnv(game, num_envs, training=training, num_threads=num_threads,
                           max_episode_frames=max_episode_frames or MAX_EPISODE_FRAMES)
    return GymVecEnv(name, _gym_factory(name, render_mode, env_kwargs), num_envs)


def _check_kwargs_apply(name: str, env_kwargs: dict[str, Any] | None) -> None:
    if env_kwargs and (name == "null" or name.startswith((ATARI_PREFIX, DOOM_PREFIX))):
        raise EnvError(f"--env-kwargs applies to gymnasium ids and module:callable envs, not {name!r}; drop it")


def is_mujoco(name: str) -> bool:
    """True for gymnasium's own MuJoCo tasks (HalfCheetah-v5, Hopper-v5, ...)."""
    spec = gym.registry.get(name)
    return spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco")


def _rom_ids() -> list[str]:
    try:
        from ale_py.roms import get_all_rom_ids
    except ImportError:
        return []
    return list(get_all_rom_ids())


def _is_ale(spec: gym.envs.registration.EnvSpec) -> bool:
    return str(spec.entry_point).startswith("ale_py")


def _gym_factory(name: str, render_mode: str | None = None,
                 env_kwargs: dict[str, Any] | None = None) -> Callable[[], gym.Env]:
    spec = gym.registry.get(name)
    if spec is not None:
        if _is_ale(spec):
            raise _use_atari(name, spec)
        return lambda: _make_gym(name, render_mode, env_kwargs)
    if ":" in name:
        return _custom_factory(name, render_mode, env_kwargs)
    raise _unknown(name)


def _make_gym(name: str, render_mode: str | None = None, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    try:
        return gym.make(name, **(env_kwargs or {}), **({"render_mode": render_mode} if render_mode else {}))
    except (gym.error.Error, TypeError) as e:  # TypeError: a constructor argument it does not take
        hint = " (pip install 'asyncrl[mujoco]')" if is_mujoco(name) and "mujoco" in str(e).lower() else ""
        raise EnvError(f"cannot make gymnasium env {name!r}: {_first_line(e)}{hint}") from e


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0]


def _custom_factory(name: str, render_mode: str | None = None,
                    env_kwargs: dict[str, Any] | None = None) -> Callable[[], gym.Env]:
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise EnvError(f"custom env {name!r} must be given as module:callable")
    if os.getcwd() not in sys.path and "" not in sys.path:  # a my_env.py beside the user, as `python -c` finds it
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EnvError(f"cannot import module {module_name!r} for env {name!r}: {e}") from e
    if attr in gym.registry:  # gymnasium's own `module:EnvId` form (the import registered the id)
        return _gym_factory(attr, render_mode, env_kwargs)
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EnvError(f"module {module_name!r} has no attribute {attr!r} (env {name!r})") from None
    if not callable(obj):
        raise EnvError(f"{name!r} is not callable; it should return a gymnasium.Env")
    make: Callable[[], object] = obj

    kwargs = dict(env_kwargs or {})

    def factory() -> gym.Env:
        try:
            env = make(**kwargs)
        except TypeError as e:
            if not kwargs:
                raise
            raise EnvError(f"{name!r} does not take --env-kwargs {kwargs}: {_first_line(e)}") from e
        if not isinstance(env, gym.Env):
            raise EnvError(f"{name!r} returned a {type(env).__name__}, not a gymnasium.Env")
        return env

    return factory


def _use_atari(name: str, spec: gym.envs.registration.EnvSpec) -> EnvError:
    game = spec.kwargs.get("game", "<game>")
    return EnvError(f"{name!r} is an ale_py gymnasium id; use {ATARI_PREFIX}{game} for preprocessed Atari")


def _unknown(name: str) -> EnvError:
    rom_ids = _rom_ids()  # importing ale_py also registers its gymnasium ids
    spec = gym.registry.get(name)
    if spec is not None and _is_ale(spec):
        return _use_atari(name, spec)
    by_lower = {"null": "null"}
    for rom in rom_ids:  # `breakout` and `atari_breakot` both suggest atari_breakout
        by_lower[rom] = by_lower[ATARI_PREFIX + rom] = ATARI_PREFIX + rom
    by_lower.update((k.lower(), k) for k, s in gym.registry.items() if not _is_ale(s))
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=6, cutoff=0.75)
    matches = list(dict.fromkeys(by_lower[m] for m in close))[:3]
    if matches:
        return EnvError(f"unknown env {name!r}; did you mean: {', '.join(matches)}? {NAME_HELP}")
    return EnvError(f"unknown env {name!r}. {NAME_HELP}")
