"""PNG figures of a run's metrics records (matplotlib, Agg backend; imported only by the offline tools)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

Record = dict[str, Any]
SPLIT = ("learner_forward_frac", "learner_backward_frac", "learner_optim_frac")


def stage_layers(records: Sequence[Record]) -> dict[str, dict[str, list[float]]]:
    """panel -> {stage label: share of wall time per record}; learner training is split where timed."""
    def col(key: str) -> list[float]:
        return [r.get(key) or 0.0 for r in records]

    learner = {"wait": col("learner_wait_frac"), "copy": col("learner_copy_frac")}
    if any(r.get(SPLIT[0]) is not None for r in records):
        learner.update(forward=col(SPLIT[0]), backward=col(SPLIT[1]), optimizer=col(SPLIT[2]))
        learner["train (other)"] = [max(0.0, t - sum(r.get(k) or 0.0 for k in SPLIT))
                                    for t, r in zip(col("learner_train_frac"), records)]
    else:
        learner["train"] = col("learner_train_frac")
    return {
        "rollout workers": {"env step": col("rollout_env_frac"), "wait": col("rollout_wait_frac")},
        "policy workers": {"inference": col("policy_infer_frac"), "wait": col("policy_wait_frac")},
        "learner": learner,
    }


def _xy(records: Sequence[Record], key: str, x: str = "frames") -> tuple[list[float], list[float]]:
    pts = [(r.get(x), r.get(key)) for r in records]
    pts = [(a, b) for a, b in pts if isinstance(a, int | float) and isinstance(b, int | float) and math.isfinite(b)]
    return [a for a, _ in pts], [b for _, b in pts]


def _save(fig: plt.Figure, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def learning_curve(records: Sequence[Record], path: str) -> str:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*_xy(records, "episode_return_mean"), label="mean return (last 100 episodes)")
    ax.set(xlabel="frames", ylabel="episode return", title="Learning curve")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def throughput(records: Sequence[Record], path: str) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(*_xy(records, "fps", "time"))
    a.set(xlabel="seconds", ylabel="frames / s", title="Throughput")
    b.plot(*_xy(records, "policy_lag_mean", "time"), label="mean")
    b.plot(*_xy(records, "policy_lag_max", "time"), label="max")
    b.set(xlabel="seconds", ylabel="updates", title="Policy lag")
    b.legend()
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def health(records: Sequence[Record], path: str, entropy_floor: float | None = None) -> str:
    panels = [("entropy", "Policy entropy", False), ("value_loss", "Value loss", True), ("kl", "KL", True),
              ("grad_norm", "Gradient norm (max dotted)", True), ("policy_loss", "Policy loss", False),
              ("nonfinite_updates", "Skipped NaN/Inf updates", False)]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (key, title, log) in zip(axes.flat, panels):
        xs, ys = _xy(records, key)
        ax.plot(xs, ys)
        if key == "grad_norm":
            ax.plot(*_xy(records, "grad_norm_max"), ":")
        if key == "entropy" and entropy_floor is not None:
            ax.axhline(entropy_floor, color="red", ls="--", lw=1, label="collapse")
            ax.legend()
        if log and ys and min(ys) > 0:
            ax.set_yscale("log")
        ax.set(title=title, xlabel="frames")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def stages(records: Sequence[Record], path: str) -> str:
    rows = [r for r in records if r.get("rollout_env_frac") is not None and isinstance(r.get("time"), int | float)]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for ax, (panel, layers) in zip(axes, stage_layers(rows).items()):
        if rows:
            ax.stackplot([r["time"] for r in rows], *layers.values(), labels=list(layers))
            ax.legend(loc="lower left", fontsize=8)
        ax.set(title=panel, xlabel="seconds", ylim=(0, 1))
    axes[0].set_ylabel("share of wall time")
    return _save(fig, path)


def resources(records: Sequence[Record], path: str) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    kinds = sorted({k[len("rss_mb_"):] for r in records for k in r if k.startswith("rss_mb_")} - {"total"})
    for kind in kinds:
        axes[0].plot(*_xy(records, f"rss_mb_{kind}", "time"), label=kind)
        axes[1].plot(*_xy(records, f"cpu_{kind}", "time"), label=kind)
    axes[0].plot(*_xy(records, "rss_mb_total", "time"), "k--", label="total")
    axes[0].set(title="Resident memory (MB)", xlabel="seconds")
    axes[1].set(title="CPU % (100 = one core)", xlabel="seconds")
    for q in ("requests", "full", "free", "reports"):
        axes[2].plot(*_xy(records, f"queue_{q}", "time"), label=q)
    if any("gpu_util" in r for r in records):
        axes[2].plot(*_xy(records, "gpu_util", "time"), "k:", label="GPU util %")
    axes[2].set(title="Queue lengths (messages)", xlabel="seconds")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _save(fig, path)


def report_figures(records: Sequence[Record], out_dir: str, entropy_floor: float | None = None) -> dict[str, str]:
    """Every figure of the diagnosis, by name -> path."""
    os.makedirs(out_dir, exist_ok=True)
    join = os.path.join
    return {
        "learning_curve": learning_curve(records, join(out_dir, "learning_curve.png")),
        "throughput": throughput(records, join(out_dir, "throughput.png")),
        "health": health(records, join(out_dir, "health.png"), entropy_floor),
        "stages": stages(records, join(out_dir, "stages.png")),
        "resources": resources(records, join(out_dir, "resources.png")),
    }


def compare_runs(runs: Sequence[tuple[str, Sequence[Record]]], x: str, path: str,
                 metric: str = "episode_return_mean") -> str:
    """Learning curves (or another metric, e.g. an env's `info_<key>`) of several runs on one figure; x is
    "frames" or "time"."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, records in runs:
        ax.plot(*_xy(records, metric, x), label=label)
    ylabel = "episode return" if metric == "episode_return_mean" else metric
    ax.set(xlabel="frames" if x == "frames" else "seconds", ylabel=ylabel,
           title="Learning curves" if metric == "episode_return_mean" else metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
