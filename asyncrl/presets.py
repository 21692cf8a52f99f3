"""Per-family defaults: the Config defaults are tuned for Atari; low-dimensional control gets its own.

A preset only fills in what the user did not set on the command line.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "atari": {},
    # Vector observations, MLP policy (CartPole, Pendulum, custom envs).
    "vector": {},
}


def preset_name(env: str) -> str:
    return "atari" if env.startswith("atari_") else "vector"


def preset_for(env: str) -> dict[str, Any]:
    return dict(PRESETS[preset_name(env)])
