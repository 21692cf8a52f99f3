"""How env names are told apart: the backends' prefixes, gymnasium's MuJoCo ids, ale_py's ROMs, and the one-line
error for a name no backend knows (with close matches). Light: gymnasium only (ale_py when a name asks)."""

from __future__ import annotations

import difflib

import gymnasium as gym

from asyncrl.envs.base import EnvError

ATARI_PREFIX = "atari_"
GYMNAX_PREFIX = "gymnax:"
PETTINGZOO_PREFIX = "pettingzoo:"
ENVPOOL_PREFIX = "envpool:"
PLAYGROUND_PREFIX = "playground:"
ISAACLAB_PREFIX = "isaaclab:"
NAME_HELP = ("Run with a registered gymnasium id, atari_<game>, doom_<scenario>, gymnax:<id>, envpool:<task id>, "
             "playground:<env>, isaaclab:<task>, pettingzoo:<family>.<env>, null, or module:callable")


def is_mujoco(name: str) -> bool:
    """True for gymnasium's own MuJoCo tasks (HalfCheetah-v5, Hopper-v5, ...)."""
    spec = gym.registry.get(name)
    return spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco")


def rom_ids() -> list[str]:
    """ale_py's ROM names ([] without ale_py)."""
    try:
        from ale_py.roms import get_all_rom_ids
    except ImportError:
        return []
    return list(get_all_rom_ids())


def is_ale(spec: gym.envs.registration.EnvSpec) -> bool:
    return str(spec.entry_point).startswith("ale_py")


def use_atari(name: str, spec: gym.envs.registration.EnvSpec) -> EnvError:
    game = spec.kwargs.get("game", "<game>")
    return EnvError(f"{name!r} is an ale_py gymnasium id; use {ATARI_PREFIX}{game} for preprocessed Atari")


def unknown_env(name: str) -> EnvError:
    """The one-line error for a name no backend knows, with close matches where there are some."""
    roms = rom_ids()  # importing ale_py also registers its gymnasium ids
    spec = gym.registry.get(name)
    if spec is not None and is_ale(spec):
        return use_atari(name, spec)
    by_lower = {"null": "null"}
    for rom in roms:  # `breakout` and `atari_breakot` both suggest atari_breakout
        by_lower[rom] = by_lower[ATARI_PREFIX + rom] = ATARI_PREFIX + rom
    by_lower.update((k.lower(), k) for k, s in gym.registry.items() if not is_ale(s))
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=6, cutoff=0.75)
    matches = list(dict.fromkeys(by_lower[m] for m in close))[:3]
    if matches:
        return EnvError(f"unknown env {name!r}; did you mean: {', '.join(matches)}? {NAME_HELP}")
    return EnvError(f"unknown env {name!r}. {NAME_HELP}")
