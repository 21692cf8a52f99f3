"""TensorBoard tags: each metrics.jsonl key under a namespace, so TensorBoard groups related charts.

`episode/` returns and lengths; `losses/` loss terms and gradients; `policy/` entropy, KL, clipping, learning
rate, versions and staleness; `perf/` throughput, stage-time fractions and queue lengths; `sys/` CPU, memory and
GPU; `health/` restarts, env errors and non-finite updates; `eval/` evaluation returns (`--eval-every`); `env/`
the env's own episode metrics (`info_<key>`);
`replay/` the off-policy learners' replay and critic figures (buffer size, UTD, sample age, Q divergence);
`policy_<k>/` one policy's figures of a --num-policies run.
metrics.jsonl keeps the bare keys. Torch-free.
"""

from __future__ import annotations

EXACT = {
    "episodes": "episode", "episode_return_mean": "episode", "episode_return_mean_20": "episode",
    "episode_len_mean": "episode", "win_rate": "episode",
    "policy_loss": "losses", "value_loss": "losses", "grad_norm": "losses", "grad_norm_max": "losses",
    "entropy": "policy", "entropy_floor": "policy", "kl": "policy", "clip_fraction": "policy",
    "learning_rate": "policy", "policy_version": "policy", "learner_updates": "policy",
    "policy_lag_mean": "policy", "policy_lag_max": "policy", "dropped_stale": "policy",
    "frames": "perf", "env_steps": "perf", "fps": "perf", "sps": "perf", "inference_batch_mean": "perf",
    "critic_loss": "losses", "actor_loss": "losses", "alpha": "policy",
    "replay_size": "replay", "utd_achieved": "replay", "updates": "replay", "updates_total": "replay",
    "sample_age_mean": "replay", "sample_lag_mean": "replay", "q_update_mean": "replay", "q_mean": "replay",
    "q_return_mean": "replay", "q_divergence": "replay",
    "worker_restarts": "health", "policy_restarts": "health", "env_errors": "health", "nonfinite_updates": "health",
    "core_saturation": "health",
}
PREFIXES = (("eval_", "eval"), ("info_", "env"), ("queue_", "perf"), ("cpu_", "sys"), ("rss_", "sys"), ("gpu_", "sys"),
            ("mem_", "sys"))
SUFFIXES = (("_frac", "perf"),)
FALLBACK = "sys"


def namespace(key: str) -> str:
    """The namespace of a metrics key (keys added later without a rule go under sys/)."""
    if key in EXACT:
        return EXACT[key]
    for prefix, space in PREFIXES:
        if key.startswith(prefix):
            return space
    for suffix, space in SUFFIXES:
        if key.endswith(suffix):
            return space
    return FALLBACK


def tb_tag(key: str) -> str:
    """`episode_return_mean` -> `episode/episode_return_mean`; the key itself is kept whole after the slash. A key
    that names its own group (`policy_<k>/...`, one policy of --num-policies) is its own tag."""
    return key if "/" in key else f"{namespace(key)}/{key}"
