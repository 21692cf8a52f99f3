"""The layout changes a bottleneck verdict calls for: what `asyncrl-tune` tries next and what the dashboard suggests.

A layout is the part of a Config that decides how the work is spread over processes and messages (`LAYOUT`):
rollout workers, envs per worker, worker splits, policy workers, the batch and its minibatches, learner threads.
Each verdict (asyncrl.diagnostics.bottleneck) names the stage that limits throughput; `moves` lists the one-flag
changes that relieve that stage, best first:

* env-bound         -> more envs per worker, more rollout workers
* inference-bound   -> more envs per split (bigger requests), more policy workers
* training-bound    -> bigger minibatches, more learner threads, fewer rollout workers (cores for the learner)
* transfer-bound    -> fewer, bigger messages: fewer splits, more envs per split, fewer workers
* CPU-starved       -> fewer workers
* dropping samples  -> fewer envs in flight (lag grows with the envs per batch), then the training moves

Learning stays as the preset set it: the rollout, epochs and learning rate are never changed; the batch may grow to
twice the reference batch (the learning rate then follows asyncrl's sqrt rule, as for any bigger batch) and a
minibatch may hold up to twice the reference minibatch's samples. Every move is checked with Config.validate.
Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from asyncrl.config import PPO_ONLY, Config, ConfigError

LAYOUT = ("workers", "envs_per_worker", "worker_splits", "policy_workers", "batch_size", "minibatches",
          "learner_threads")
DROPPING = 0.01  # a share of dropped (too stale) samples above which the lag is the problem to fix first
MAX_ENV_GROWTH = 8  # envs per worker at most this many times the reference's


@dataclass(frozen=True)
class Move:
    """One flag change: the setting, its new value and why."""

    name: str
    value: int
    why: str

    @property
    def flag(self) -> str:
        """`--envs-per-worker 64`."""
        return f"--{self.name.replace('_', '-')} {self.value}"


@dataclass(frozen=True)
class Reference:
    """The learning constraints a layout must keep: the reference (preset's) batch and minibatch size, and the
    envs per worker the growth limit counts from."""

    batch_size: int
    minibatch: int
    envs_per_worker: int

    @classmethod
    def of(cls, cfg: Config) -> Reference:
        minibatches = cfg.minibatches if cfg.algo in PPO_ONLY else 1
        return cls(cfg.batch_size, max(1, cfg.batch_size // max(1, minibatches)), max(1, cfg.envs_per_worker))


def layout_of(cfg: Config) -> dict[str, int]:
    """The layout fields of `cfg` (minibatches only for APPO: the replay learners take no such flag)."""
    out = {name: int(getattr(cfg, name)) for name in LAYOUT}
    if cfg.algo not in PPO_ONLY:
        out.pop("minibatches")
    return out


def layout_text(layout: dict[str, int]) -> str:
    """`2w x 64e/2s 1p b2048/2 t0`: workers x envs per worker / splits, policy workers, batch / minibatches,
    learner threads (t0: auto)."""
    mb = f"/{layout['minibatches']}" if "minibatches" in layout else ""
    return (f"{layout['workers']}w x {layout['envs_per_worker']}e/{layout['worker_splits']}s "
            f"{layout['policy_workers']}p b{layout['batch_size']}{mb} t{layout['learner_threads']}")


def effective_learner_threads(cfg: Config, cores: int) -> int:
    """The torch threads the learner runs with (--learner-threads 0: the CPU default, asyncrl/runtime/host/cpus.py)."""
    if cfg.learner_threads:
        return cfg.learner_threads
    return max(1, cores - cfg.policy_workers) if cfg.device == "cpu" or cfg.device == "auto" else 1


def _within(cfg: Config, ref: Reference) -> bool:
    """The learning constraints: batch in [ref, 2 ref], minibatch samples in [ref mb / 2, 2 ref mb], envs growth."""
    if not ref.batch_size <= cfg.batch_size <= 2 * ref.batch_size:
        return False
    if cfg.envs_per_worker > MAX_ENV_GROWTH * ref.envs_per_worker:
        return False
    if cfg.algo in PPO_ONLY:
        mb = cfg.batch_size // cfg.minibatches
        return ref.minibatch // 2 <= mb <= 2 * ref.minibatch
    return True


def _valid(cfg: Config) -> bool:
    try:
        cfg.validate()
    except ConfigError:
        return False
    return True


def repair(cfg: Config, ref: Reference) -> Config | None:
    """`cfg`, or with its batch and minibatches moved to the nearest valid values within the learning constraints
    (a new envs per split may not divide the batch); None when there are none."""
    if _valid(cfg) and _within(cfg, ref):
        return cfg
    chunk = cfg.rollout * max(1, cfg.envs_per_split)
    batches = [b for b in range(chunk, 2 * ref.batch_size + 1, chunk) if b >= ref.batch_size]
    for batch in sorted(batches, key=lambda b: (abs(b - cfg.batch_size), b)):
        options = [cfg.minibatches] if cfg.algo not in PPO_ONLY else sorted(
            range(1, batch + 1), key=lambda m: (abs(batch // m - ref.minibatch), m))[:16]
        for minibatches in options:
            fixed = dataclasses.replace(cfg, batch_size=batch, minibatches=minibatches)
            if _valid(fixed) and _within(fixed, ref):
                return fixed
    return None


def apply(cfg: Config, move: Move, ref: Reference) -> Config | None:
    """`cfg` with `move` made (and the batch repaired around it), or None where it breaks a rule."""
    changed = dataclasses.replace(cfg, **{move.name: move.value})
    fixed = repair(changed, ref)
    if fixed is None or getattr(fixed, move.name) != move.value:
        return None
    return fixed


def _candidates(cfg: Config, kind: str | None, dropped: float, cores: int, ref: Reference) -> list[Move]:
    """Every move the verdict calls for, best first (not yet checked against the rules)."""
    w, e, s, p = cfg.workers, cfg.envs_per_worker, cfg.worker_splits, cfg.policy_workers
    threads = effective_learner_threads(cfg, cores)
    more_envs = Move("envs_per_worker", 2 * e, "more envs per worker (each worker steps more envs per message)")
    if 4 * e <= ref.envs_per_worker:  # far below the preset's: go there at once rather than double step by step
        more_envs = Move("envs_per_worker", ref.envs_per_worker, "the preset's envs per worker (many more per message)")
    more_workers = Move("workers", w + 1, "one more rollout worker")
    fewer_workers = Move("workers", w - 1, "one rollout worker fewer (its core goes to the busy stage)")
    fewer_splits = Move("worker_splits", max(1, s // 2), "fewer worker splits (more envs per request)")
    fewer_envs = Move("envs_per_worker", max(s, e // 2), "fewer envs in flight (less policy lag)")
    more_policy = Move("policy_workers", p + 1, "one more policy worker")
    bigger_mb = Move("minibatches", max(1, cfg.minibatches // 2), "bigger minibatches (fewer optimizer steps)")
    more_threads = Move("learner_threads", cores, f"{cores} learner threads (one per usable core)")
    training = [bigger_mb] if cfg.algo in PPO_ONLY else []
    training += ([more_threads] if threads < cores else []) + [fewer_workers, fewer_envs]
    moves: list[Move] = []
    if dropped > DROPPING:
        moves += [fewer_envs, *training]
    by_kind = {
        "env": [more_envs, more_workers, fewer_splits],
        "inference": [fewer_splits, more_envs, more_policy],
        "training": training,
        "transfer": [fewer_splits, more_envs, fewer_workers],
        "remote": [fewer_splits, more_envs],
        "starved": [fewer_workers, fewer_envs],
    }
    chosen = by_kind.get(kind or "", [more_envs, more_workers])
    if 4 * e <= ref.envs_per_worker and more_envs in chosen:
        chosen = [more_envs, *(m for m in chosen if m != more_envs)]
    moves += chosen
    limit_ok = [m for m in moves if m.value >= 1 and m.value != getattr(cfg, m.name)
                and not (m.name == "workers" and m.value > 2 * cores)
                and not (m.name == "policy_workers" and m.value > max(2, cores // 2))]
    return list(dict.fromkeys(limit_ok))  # first occurrence of each


def moves(cfg: Config, kind: str | None, dropped: float, cores: int, ref: Reference) -> list[tuple[Move, Config]]:
    """The one-flag changes the verdict `kind` (and a `dropped` share of stale samples) calls for, best first, each
    with the Config it makes; moves that break a rule are left out."""
    out = []
    for move in _candidates(cfg, kind, dropped, cores, ref):
        made = apply(cfg, move, ref)
        if made is not None:
            out.append((move, made))
    return out


def suggestion(cfg: Config, record: dict[str, Any], cores: int) -> str | None:
    """What a person should change now, as the tuner would (its first move): only where it matters, when the
    learner is the bottleneck or stale samples are being dropped; None otherwise."""
    kind, dropped = record.get("bottleneck"), record.get("dropped_share") or 0.0
    if kind != "training" and dropped <= DROPPING:
        return None
    found = moves(cfg, kind, dropped, cores, Reference.of(cfg))
    if not found:
        return None
    move, made = found[0]
    also = [f"--{k.replace('_', '-')} {getattr(made, k)}" for k in LAYOUT
            if k != move.name and getattr(made, k) != getattr(cfg, k)]
    why = "the learner is the bottleneck" if kind == "training" else f"{dropped:.0%} of the samples are dropped"
    return f"{why}: try {move.flag}{' ' + ' '.join(also) if also else ''} ({move.why}; asyncrl-tune measures it)"
