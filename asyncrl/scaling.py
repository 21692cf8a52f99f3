"""Scaling rules: `--scale` (PPO settings by env count) and `--lr-scaling` (learning rate by global batch).

The `--scale` presets follow the PPO scaling table of the practical scaling guide (64 / 4,096 / 65,536 envs;
Rudin et al. 2022, "Learning to Walk in Minutes Using Massively Parallel Deep RL", use the same regime). GAE's
lambda 0.95 maps to V-trace's c-bar (`--vtrace-c`), which on-policy cuts traces exactly as lambda does (Espeholt
et al. 2018, IMPALA, remark 1). One batch is one rollout of every env, as in PPO: batch = envs x rollout.

`--lr-scaling` multiplies the base learning rate by k (linear; Goyal et al. 2017) or sqrt(k) (Krizhevsky 2014;
Hoffer et al. 2017), where k = global batch / `--lr-reference-batch`: a batch k times larger has 1/k of the
gradient variance. Neither `--lr-scaling` nor `--lr` given, APPO takes the sqrt rule once the global batch
exceeds the batch its base rate was set for (`asyncrl.resolve.default_lr_rule`). Torch-free: the config imports it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

SCALES: dict[str, dict[str, Any]] = {
    # envs is the global env count (all ranks); the rest are Config fields.
    "small": {"envs": 64, "lr": 3e-4, "rollout": 128, "minibatches": 4, "epochs": 4, "gamma": 0.99,
              "vtrace_c": 0.95},
    "medium": {"envs": 4096, "lr": 1e-3, "rollout": 32, "minibatches": 4, "epochs": 5, "gamma": 0.99,
               "vtrace_c": 0.95},
    # The guide says 16-24 steps: 16 keeps envs x rollout a power of two (so every minibatch and split count
    # divides it), and 65,536 envs x 16 steps is already a 1,048,576-sample batch.
    "large": {"envs": 65536, "lr": 3e-3, "rollout": 16, "minibatches": 8, "epochs": 5, "gamma": 0.99,
              "vtrace_c": 0.95},
}
LR_RULES = ("none", "sqrt", "linear")
WORKERS_PER_CORE = 2  # rollout workers wait for actions much of the time (as the --workers default)
MAX_ENVS_PER_WORKER = 256  # beyond this one process steps envs slower than the policy serves them


def world_size(environ: dict[str, str] | None = None) -> int:
    """The ranks of a torchrun launch (1 otherwise); the same test as runtime.distributed.rank.rank_from_environ."""
    env = os.environ if environ is None else environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")):
        return 1
    try:
        return max(1, int(env["WORLD_SIZE"]))
    except ValueError:
        return 1


def scale_settings(scale: str, given: dict[str, Any], *, cores: int, world: int = 1, batched: bool = False,
                   fits: Callable[[int, int, int, int], bool] = lambda w, e, t, s: True) -> dict[str, Any]:
    """The settings `--scale` gives (the caller lays the explicitly given ones over them).

    Envs per rank = the preset's envs / ranks, hosted by up to WORKERS_PER_CORE x cores workers of at most
    MAX_ENVS_PER_WORKER envs each (a `batched` env, one VectorEnv call per split step: one worker a core and no
    cap), halved while `fits(workers, envs_per_worker, rollout, splits)` says the trajectory buffer would not
    fit in memory. Given `workers`, `envs_per_worker`, `rollout`, `worker_splits` are respected; batch_size =
    workers x envs_per_worker x rollout (one rollout of every env of this rank).
    """
    preset = SCALES[scale]
    out = {k: v for k, v in preset.items() if k != "envs"}
    rollout = int(given.get("rollout", preset["rollout"]))
    splits = max(1, int(given.get("worker_splits", 2)))
    per_rank = max(splits, preset["envs"] // max(world, 1))
    workers = given.get("workers")
    if workers is None:
        workers = max(1, min((1 if batched else WORKERS_PER_CORE) * max(cores, 1), per_rank // splits))
        while per_rank % (workers * splits):
            workers -= 1
    envs = given.get("envs_per_worker")
    if envs is None:
        envs = per_rank // workers if batched else min(MAX_ENVS_PER_WORKER, per_rank // workers)
        envs = max(splits, envs - envs % splits)
        while envs > splits and not fits(workers, envs, rollout, splits):
            envs = max(splits, (envs // 2) - (envs // 2) % splits)
    out.update(workers=workers, envs_per_worker=envs)
    out["batch_size"] = workers * envs * rollout
    return out


def scale_note(scale: str, workers: int, envs_per_worker: int, world: int = 1) -> str | None:
    """One line when the run hosts fewer envs than the `--scale` preset asks for (None when it hosts them)."""
    if not scale:
        return None
    want, have = SCALES[scale]["envs"], workers * envs_per_worker * world
    if have >= want:
        return None
    ranks = f" x {world} ranks" if world > 1 else ""
    return (f"scaling: --scale {scale} asks for {want:,} envs; this machine hosts {have:,} ({workers} workers x "
            f"{envs_per_worker} envs{ranks}: at most {WORKERS_PER_CORE} workers a core, {MAX_ENVS_PER_WORKER} envs "
            f"a worker unless the env is batched, trajectories within 80% of free RAM), so the run uses {have:,}")


def lr_factor(rule: str, global_batch: int, reference: int) -> float:
    """The learning-rate multiplier for a global batch `global_batch` against `reference` under `rule`."""
    k = global_batch / reference
    return {"none": 1.0, "sqrt": math.sqrt(k), "linear": k}[rule]


def scaling_line(*, envs: int, rollout: int, epochs: int, batch_size: int, world: int, rule: str, reference: int,
                 lr_base: float, lr: float) -> str:
    """The line printed at start, e.g. `scaling: 64 envs x 128 steps x 4 epochs = B_eff 32,768; global batch
    8,192 = 8x the reference 1,024 -> lr 3e-4 x sqrt(8) = 8.5e-4 (--lr-scaling sqrt)`."""
    global_batch = batch_size * world
    ranks = f" ({world} ranks x {batch_size:,})" if world > 1 else ""
    head = (f"scaling: {envs:,} envs x {rollout} steps x {epochs} epochs = B_eff {envs * rollout * epochs:,}; "
            f"global batch {global_batch:,}{ranks}")
    if rule == "none":
        return f"{head} -> lr {_g(lr)} (--lr-scaling none)"
    k = global_batch / reference
    factor = f"sqrt({_g(k)})" if rule == "sqrt" else _g(k)
    return (f"{head} = {_g(k)}x the reference {reference:,} -> lr {_g(lr_base)} x {factor} = {_g(lr)} "
            f"(--lr-scaling {rule})")


def _g(x: float) -> str:
    """Short: 0.0003 as 3e-4, 0.00085 as 8.5e-4, 8.0 as 8, 2.83 as 2.83."""
    if x and abs(x) < 0.01:
        mantissa, exponent = f"{x:.1e}".split("e")
        return f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return f"{x:.3g}"
