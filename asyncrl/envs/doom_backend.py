"""The registry's `doom_<scenario>` row: one game per env (`asyncrl.envs.doom`), or a network match's players a
process each (`asyncrl.envs.doom_match`)."""

from __future__ import annotations

from asyncrl.envs.base import EnvSpec, VecEnv
from asyncrl.envs.doom import DoomVecEnv, doom_env_spec, scenario
from asyncrl.envs.doom_match import DoomMatchVecEnv


def backend_spec(name: str, doom_measurements: bool = False) -> EnvSpec:
    """The registry's `doom_<scenario>` row: the spec, without starting a game."""
    return doom_env_spec(name, measurements=doom_measurements)


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                doom_measurements: bool = False) -> VecEnv:
    """The registry's `doom_<scenario>` row: `num_envs` games (a network match's players a process each)."""
    if scenario(name).players > 1:
        return DoomMatchVecEnv(name, num_envs, training=training, measurements=doom_measurements)
    return DoomVecEnv(name, num_envs, training=training, measurements=doom_measurements)
