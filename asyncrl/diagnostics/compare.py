"""Statistics across seeds: groups of runs compared by their final returns and learning curves.

A *group* is a directory whose subdirectories are run directories (each with metrics.jsonl). A run's final
score is the mean of the metric over its last `FINAL_RECORDS` records that have a value. Per group: the
interquartile mean (IQM, `scipy.stats.trim_mean(x, 0.25)`) of the final scores with a 95% percentile
bootstrap confidence interval (`scipy.stats.bootstrap`, resampling runs; with one task the stratified bootstrap
of Agarwal et al. 2021 resamples runs within that one stratum). Between two groups: the probability of
improvement P(X > Y) + P(X = Y) / 2 (the Mann-Whitney U statistic over n_x * n_y), Welch's t-test p-value and
the Mann-Whitney U test p-value. Frames to a threshold count only records whose rolling mean spans a full window
(`RETURN_WINDOW` episodes): at the start of a run the mean of a few lucky episodes would cross it. Torch-free.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from asyncrl.diagnostics.aggregate import RETURN_WINDOW
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.diagnostics.rundir import RunDirError
from asyncrl.diagnostics.windowed import windowed

FINAL_RECORDS = 5  # a run's final score: the mean of the metric over its last 5 records that have one
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # fixed, so the same runs always give the same intervals
GRID_POINTS = 100


@dataclass
class Run:
    path: str
    frames: np.ndarray  # frames of the records that have the metric
    values: np.ndarray  # the metric at those frames
    full_window: np.ndarray  # per point: the run had ended RETURN_WINDOW episodes (or its record has no count)

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    def final(self) -> float:
        return float(np.mean(self.values[-FINAL_RECORDS:]))

    def frames_to(self, threshold: float) -> int | None:
        """Frames of the first record, over a full window of episodes, whose metric is >= threshold; None if
        never."""
        hit = np.nonzero((self.values >= threshold) & self.full_window)[0]
        return int(self.frames[hit[0]]) if hit.size else None


@dataclass
class Group:
    label: str
    path: str
    runs: list[Run] = field(default_factory=list)

    def finals(self) -> np.ndarray:
        return np.array([r.final() for r in self.runs], dtype=np.float64)


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end)."""
    return stats.trim_mean(x, 0.25, axis=axis)


def bootstrap_ci(x: np.ndarray, statistic=iqm) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of `statistic` over runs; None with fewer than two runs."""
    if len(x) < 2:
        return None
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = stats.bootstrap((x,), statistic, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                          method="percentile", vectorized=True, axis=-1, rng=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) + P(X = Y) / 2 over every pair of a run of x and a run of y (Agarwal et al. 2021)."""
    u = stats.mannwhitneyu(x, y, alternative="two-sided").statistic
    return float(u / (len(x) * len(y)))


def welch_p(x: np.ndarray, y: np.ndarray) -> float | None:
    """Two-sided Welch's t-test p-value; None where it is undefined (fewer than two runs, no variance)."""
    if len(x) < 2 or len(y) < 2:
        return None
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no variance: scipy warns and returns nan
        p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def mannwhitney_p(x: np.ndarray, y: np.ndarray) -> float | None:
    """Two-sided Mann-Whitney U test p-value; None where it is undefined (every score tied)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        p = float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    return p if math.isfinite(p) else None


def load_run_curve(path: str, metric: str, at_frames: float | None = None, window: int | None = None) -> Run | None:
    """The (frames, metric) points of one run, up to `at_frames` if given; None when it has no record with
    the metric. A run that stopped before `at_frames` is a one-line error: its score would not be comparable.
    `window`: the records get `episode_return_window` over that many env steps first (windowed.py)."""
    records = read_metrics(path)
    if window is not None:
        records = windowed(records, window)[0]
    if at_frames is not None:
        reached = max((r["frames"] for r in records if _number(r.get("frames"))), default=0)
        if reached < at_frames:
            raise RunDirError(f"{path} stopped at {reached:,} frames, before --at-frames {at_frames:,.0f}; "
                              f"continue it (asyncrl-train ... --resume --frames N) or lower --at-frames")
        records = [r for r in records if _number(r.get("frames")) and r["frames"] <= at_frames]
    pts = [(r.get("frames"), r.get(metric), r.get("episodes")) for r in records]
    pts = [(f, v, e) for f, v, e in pts if _number(f) and _number(v) and math.isfinite(v)]
    if not pts:
        return None
    frames, values, episodes = zip(*pts)
    full = np.array([not _number(e) or e >= RETURN_WINDOW for e in episodes], dtype=bool)
    return Run(path, np.asarray(frames, dtype=np.float64), np.asarray(values, dtype=np.float64), full)


def load_group(path: str, metric: str, label: str | None = None, at_frames: float | None = None,
               window: int | None = None) -> Group:
    """Every run directory (a subdirectory with metrics.jsonl) of `path`, each cut at `at_frames` if given; a
    one-line error if there is none."""
    if not os.path.isdir(path):
        raise RunDirError(f"no group directory {path}; pass directories that each hold run directories")
    group = Group(label or os.path.basename(os.path.normpath(path)), path)
    for name in sorted(os.listdir(path)):
        run_dir = os.path.join(path, name)
        if os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
            run = load_run_curve(run_dir, metric, at_frames, window)
            if run is not None:
                group.runs.append(run)
    if not group.runs:
        raise RunDirError(f"{path} holds no run directory with {metric} in its metrics.jsonl "
                          f"(a group is a directory of run directories, e.g. TRAIN_DIR/GROUP)")
    return group


def group_labels(paths: list[str]) -> list[str]:
    """Each group's directory name, or its whole path where two groups share a name."""
    names = [os.path.basename(os.path.normpath(p)) for p in paths]
    return [n if names.count(n) == 1 else os.path.normpath(p) for n, p in zip(names, paths)]


def summarize(groups: list[Group], threshold: float | None = None, at_frames: float | None = None) -> dict[str, Any]:
    """Everything the comparison reports, JSON-ready."""
    rule = f"mean of the metric over each run's last {FINAL_RECORDS} records"
    if at_frames is not None:
        rule += f" at or before {at_frames:,.0f} frames"
    out: dict[str, Any] = {"final_rule": rule, "at_frames": at_frames,
                           "confidence": CONFIDENCE, "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                           "threshold": threshold, "groups": [], "pairs": []}
    for g in groups:
        finals = g.finals()
        ci = bootstrap_ci(finals)
        entry: dict[str, Any] = {
            "label": g.label, "path": g.path, "runs": len(g.runs),
            "iqm": float(iqm(finals)), "iqm_ci": list(ci) if ci else None, "mean": float(np.mean(finals)),
            "finals": {r.name: float(v) for r, v in zip(g.runs, finals)},
        }
        if threshold is not None:
            entry["frames_to_threshold"] = {r.name: r.frames_to(threshold) for r in g.runs}
        out["groups"].append(entry)
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            x, y = a.finals(), b.finals()
            out["pairs"].append({"a": a.label, "b": b.label,
                                 "probability_of_improvement": probability_of_improvement(x, y),
                                 "welch_p": welch_p(x, y), "mannwhitney_p": mannwhitney_p(x, y)})
    return out


def mean_curve(group: Group, points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(frames grid, mean curve, 95% bootstrap band [2, grid] or None) over the frames every run reached."""
    end = min(r.frames[-1] for r in group.runs)
    start = max(r.frames[0] for r in group.runs)
    grid = np.linspace(start, end, points) if end > start else np.array([end])
    curves = np.stack([np.interp(grid, r.frames, r.values) for r in group.runs])
    mean = curves.mean(axis=0)
    if len(group.runs) < 2:
        return grid, mean, None
    res = stats.bootstrap((curves,), np.mean, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                          method="percentile", vectorized=True, axis=0, rng=np.random.default_rng(BOOTSTRAP_SEED))
    band = np.stack([res.confidence_interval.low, res.confidence_interval.high])
    return grid, mean, np.where(np.isfinite(band), band, mean)


def plot_curves(groups: list[Group], metric: str, path: str) -> str:
    """One PNG: each group's mean curve on a common frames grid, with its 95% confidence band."""
    from asyncrl.diagnostics.plots import plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for g in groups:
        grid, mean, band = mean_curve(g)
        (line,) = ax.plot(grid, mean, label=f"{g.label} ({len(g.runs)} runs)")
        if band is not None:
            ax.fill_between(grid, band[0], band[1], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("frames")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean over runs, {CONFIDENCE:.0%} bootstrap band")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def format_table(summary: dict[str, Any]) -> str:
    """The summary as aligned text tables."""
    lines = [f"final score: {summary['final_rule']}; IQM with {summary['confidence']:.0%} bootstrap CI", ""]
    width = max(5, *(len(g["label"]) for g in summary["groups"]))
    lines.append(f"{'group':<{width}}  runs  {'IQM':>10}  {'95% CI':>23}  {'mean':>10}")
    for g in summary["groups"]:
        ci = "-" if g["iqm_ci"] is None else f"[{g['iqm_ci'][0]:.3f}, {g['iqm_ci'][1]:.3f}]"
        lines.append(f"{g['label']:<{width}}  {g['runs']:>4}  {g['iqm']:>10.3f}  {ci:>23}  {g['mean']:>10.3f}")
    if summary["pairs"]:
        lines += ["", f"{'A':<{width}}  {'B':<{width}}  P(A>B)  Welch p  M-W U p"]
        for p in summary["pairs"]:
            welch = "-" if p["welch_p"] is None else f"{p['welch_p']:.3g}"
            mw = "-" if p["mannwhitney_p"] is None else f"{p['mannwhitney_p']:.3g}"
            lines.append(f"{p['a']:<{width}}  {p['b']:<{width}}  {p['probability_of_improvement']:6.3f}  "
                         f"{welch:>7}  {mw:>8}")
    if summary["threshold"] is not None:
        lines += ["", f"frames to reach {summary['threshold']:g}:"]
        for g in summary["groups"]:
            for run, frames in g["frames_to_threshold"].items():
                lines.append(f"  {g['label']}/{run}: {'not reached' if frames is None else f'{frames:,}'}")
    return "\n".join(lines)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
