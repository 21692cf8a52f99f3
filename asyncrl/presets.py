"""Per-family defaults: the Config defaults are tuned for Atari; low-dimensional control gets its own.

A preset only fills in what the user did not set on the command line. An env backend with a family of its own
(asyncrl/envs/registry.py:BACKENDS: `atari_` and `doom_` names, `null`, gymnasium's MuJoCo tasks) gets that
family's preset without making an env; any other env's is chosen from its spaces: image-like observations
(uint8, 3-D) get the Atari preset, the others the `vector` preset.
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
    # gymnasium's MuJoCo locomotion tasks (HalfCheetah, Hopper, Walker2d, Ant, Humanoid): PPO's continuous-control
    # settings (normalised observations and returns, long rollouts, 10 epochs of 256-sample minibatches, no entropy
    # bonus). Return normalisation took Hopper-v5 from 550 to over 2,000 at 1M steps (docs/results.md).
    "mujoco": {
        "workers": 2, "envs_per_worker": 0, "rollout": 64, "batch_size": 2048, "epochs": 10, "minibatches": 8,
        "lr": 3e-4, "lr_schedule": "auto", "normalize_obs": True, "normalize_returns": True,
        "value_coeff": 0.5, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.99, "vtrace_c": 0.95,
        "clip_ratio": 0.2,
    },
    # --algo sac, td3, redq (continuous control, replay): one rollout worker of 8 envs and short rollouts, so each
    # slot reaches the learner after 8 steps and the batch (rollout x envs = 64 env steps) is inserted and trained
    # on (utd x 64 gradient updates) while the worker collects the next one; 256 x 256 networks, Adam 3e-4.
    "off_policy": {
        "workers": 1, "envs_per_worker": 8, "worker_splits": 2, "rollout": 8, "batch_size": 64,
        "hidden_size": 256, "lr": 3e-4, "lr_schedule": "constant", "gamma": 0.99,
        # PPO-only settings a family preset may set (mujoco: 8 minibatches, normalised observations and returns):
        # the replay learners neither split batches nor normalise observations or returns.
        "epochs": 1, "minibatches": 1, "normalize_obs": False, "normalize_returns": False,
    },
    # --algo redq on top of off_policy: 20 updates per env step, so batches of 16 env steps (2 envs, one per split)
    # keep one train() call at 320 updates, well inside the run's stall rule (no new policy version for
    # 2 x --hang-timeout stops the run); 64-step batches made 1,280 updates, over 60 s on a contended CPU.
    "off_policy_redq": {"envs_per_worker": 2, "batch_size": 16},
}


def preset_name(env: str, env_kwargs: dict[str, Any] | None = None) -> str:
    """The preset for env `env`: its backend's family (asyncrl/envs/registry.py:BACKENDS; atari_, doom_, null and
    gymnasium's MuJoCo tasks have one), otherwise from its spaces (one env made and closed; an env that cannot be
    made gets `vector` here and reports its error when the run starts)."""
    from asyncrl.envs.registry import make_env_spec, preset_family

    family = preset_family(env)
    if family is not None:
        return family
    try:
        spec = make_env_spec(env, env_kwargs=env_kwargs or {})
    except Exception:  # EnvError or the env's own: the runner makes it again and reports that in one line
        return "vector"
    image = len(spec.obs_shape) == 3 and spec.obs_dtype == "uint8"
    if spec.is_dict:  # a Dict with a uint8 image key: the CNN sets the pace, as for Atari
        image = any(k.image and k.dtype == "uint8" for k in spec.obs_keys)
    return "atari" if image else "vector"


def preset_for(env: str, env_kwargs: dict[str, Any] | None = None, algo: str = "appo") -> dict[str, Any]:
    """The env family's preset; for an off-policy `algo`, the "off_policy" preset (and "off_policy_<algo>") over it."""
    from asyncrl.agents.registry import OFF_POLICY

    if algo in OFF_POLICY:
        family = PRESETS[preset_name(env, env_kwargs)]
        return {**family, **PRESETS["off_policy"], **PRESETS.get(f"off_policy_{algo}", {})}
    return dict(PRESETS[preset_name(env, env_kwargs)])
