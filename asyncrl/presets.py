"""Per-family defaults: the Config defaults are tuned for Atari; low-dimensional control gets its own.

A preset only fills in what the user did not set on the command line. An env backend with a family of its own
(asyncrl/envs/registry.py:BACKENDS: `atari_` and `doom_` names, `null`, gymnasium's MuJoCo tasks) gets that
family's preset without making an env; any other env's is chosen from its spaces: image-like observations
(uint8, 3-D) get the Atari preset, the others the `vector` preset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym

from asyncrl.agents.appo.presets import FAMILY_PRESETS
from asyncrl.agents.off_policy.presets import ALGO_PRESETS, OFF_POLICY_PRESET

if TYPE_CHECKING:
    from asyncrl.spec_memo import EnvSpecs

PRESETS: dict[str, dict[str, Any]] = {
    **FAMILY_PRESETS,  # APPO's, per env family: asyncrl/agents/appo/presets.py
    "off_policy": OFF_POLICY_PRESET,  # the replay learners': asyncrl/agents/off_policy/presets.py
    **{f"off_policy_{algo}": values for algo, values in ALGO_PRESETS.items()},
}


def preset_name(env: str, env_kwargs: dict[str, Any] | None = None, env_vectorization: str = "auto",
                specs: EnvSpecs | None = None) -> str:
    """The preset for env `env`: its backend's family (asyncrl/envs/registry.py:BACKENDS; atari_, doom_, null and
    gymnasium's MuJoCo tasks have one), otherwise from its spaces (the env's spec from `specs`, the start's
    specs, or a new one; an env that cannot be made gets `vector` here and reports its error in the preflight):
    `atari` for uint8 frames, else `vector` (`vector_continuous` for Box actions), or `vector_batched` when the env is
    stepped as one VectorEnv batch."""
    from asyncrl.envs.registry import preset_family
    from asyncrl.spec_memo import EnvSpecs

    family = preset_family(env)
    if family is not None:
        return family
    try:
        settings = {"env": env, "env_kwargs": env_kwargs or {}, "env_vectorization": env_vectorization}
        spec = (specs or EnvSpecs()).get(settings)
    except Exception:  # EnvError or the env's own: the preflight reports it in one line
        return "vector"
    image = len(spec.obs_shape) == 3 and spec.obs_dtype == "uint8"
    if spec.is_dict:  # a Dict with a uint8 image key: the CNN sets the pace, as for Atari
        image = any(k.image and k.dtype == "uint8" for k in spec.obs_keys)
    if image:
        return "atari"
    if spec.batched:
        return "vector_batched"
    return "vector_continuous" if isinstance(spec.action_space, gym.spaces.Box) else "vector"


def preset_for(env: str, env_kwargs: dict[str, Any] | None = None, algo: str = "appo",
               env_vectorization: str = "auto", specs: EnvSpecs | None = None) -> dict[str, Any]:
    """The env family's preset; for an off-policy `algo`, the "off_policy" preset (and "off_policy_<algo>") over it."""
    from asyncrl.agents.registry import OFF_POLICY

    family = PRESETS[preset_name(env, env_kwargs, env_vectorization, specs)]
    if algo in OFF_POLICY:
        return {**family, **PRESETS["off_policy"], **PRESETS.get(f"off_policy_{algo}", {})}
    return dict(family)
