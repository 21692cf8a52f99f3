"""The default torch thread counts, built on the cores this process may use (`asyncrl.system`); no torch here."""

from __future__ import annotations

from asyncrl.system import local_world_size, usable_cpus

CUDA_LEARNER_THREADS_MAX = 4  # a CUDA learner's CPU work is batch copies and kernel launches


def default_learner_threads(device_type: str, policy_workers: int, cpus: int | None = None,
                            ranks: int | None = None) -> int:
    """torch threads for a learner with `--learner-threads 0`.

    On the CPU the learner computes: this rank's share of the usable cores, less one per policy worker. On
    CUDA the GPU computes and the rollout workers need the cores: a quarter of the share, at most
    `CUDA_LEARNER_THREADS_MAX` (more threads only spin beside the workers).
    """
    share = max(1, (usable_cpus() if cpus is None else cpus) // (local_world_size() if ranks is None else ranks))
    if device_type == "cuda":
        return max(1, min(CUDA_LEARNER_THREADS_MAX, share // 4))
    return max(1, share - policy_workers)
