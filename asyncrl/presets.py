"""Per-family defaults: the Config defaults are tuned for Atari; low-dimensional control gets its own.

A preset only fills in what the user did not set on the command line.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "atari": {},
    # VizDoom frames go through the same Nature CNN; Atari's settings, with rewards scaled per scenario in
    # asyncrl/envs/doom.py (SCENARIOS) instead of clipped.
    "doom": {},
    # Vector observations, MLP policy (CartPole, Pendulum, custom envs). Many small updates per sample; a low
    # value weight because policy and value share the MLP trunk and unscaled returns would swamp the policy.
    "vector": {
        "workers": 2, "envs_per_worker": 8, "rollout": 16, "batch_size": 256, "epochs": 8, "minibatches": 2,
        "lr": 1e-3, "lr_schedule": "auto",
        "value_coeff": 0.05, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.98, "vtrace_c": 0.8,
    },
}


def preset_name(env: str) -> str:
    if env.startswith("atari_"):
        return "atari"
    return "doom" if env.startswith("doom_") else "vector"


def preset_for(env: str) -> dict[str, Any]:
    return dict(PRESETS[preset_name(env)])
