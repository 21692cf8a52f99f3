"""One configuration's learning curve over its seeds (`asyncrl-plot RUN... --seeds-curve OUT`): OUT.csv and OUT.png.

The x axis is emulator frames (agent steps x frameskip); returns are raw whole-episode scores (metrics.jsonl's
`episode_return_mean`: the mean over the last 100 finished episodes), interpolated onto 200 points up to where the
shortest run ends. The CSV has the mean, min and max over the runs, each run's curve and the mean wall-clock seconds
at each point; the PNG the mean with a min-max band, wall-clock minutes on its top axis.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.diagnostics.rundir import RunDirError

Curve = tuple[np.ndarray, np.ndarray, np.ndarray]  # frames, episode_return_mean, time


def read_curve(run_dir: str) -> Curve:
    """(frames, episode_return_mean, time) of one run from its first finished episode on."""
    recs = [r for r in read_metrics(run_dir) if r.get("episode_return_mean") is not None]
    if not recs:
        raise RunDirError(f"{run_dir} has no finished episodes yet")
    return tuple(np.asarray([r[k] for r in recs], float) for k in ("frames", "episode_return_mean", "time"))


def first_crossing(curve: Curve, level: float) -> tuple[int, float] | None:
    """(frames, seconds) of the first point at or above `level`."""
    hit = np.nonzero(curve[1] >= level)[0]
    return (int(curve[0][hit[0]]), float(curve[2][hit[0]])) if len(hit) else None


def write_seed_curve(runs: list[str], out: str, levels: list[float]) -> list[str]:
    """Write OUT.csv and OUT.png; returns one summary line per run (frames and minutes to each level) and a last
    line naming the files."""
    curves = [read_curve(r) for r in runs]
    grid = np.linspace(min(c[0][0] for c in curves), min(c[0][-1] for c in curves), 200)
    ret = np.stack([np.interp(grid, f, r) for f, r, _ in curves])
    wall = np.stack([np.interp(grid, f, t) for f, _, t in curves])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["frames", "return_mean", "return_min", "return_max", "wall_seconds_mean",
                    *[f"return_{r.strip('/').replace('/', '_')}" for r in runs]])
        for i, x in enumerate(grid):
            w.writerow([int(x), ret[:, i].mean(), ret[:, i].min(), ret[:, i].max(), wall[:, i].mean(), *ret[:, i]])
    _plot(grid, ret, wall, out + ".png")
    lines = []
    for run, curve in zip(runs, curves):
        hits = [(lvl, first_crossing(curve, lvl)) for lvl in levels]
        marks = ", ".join(f"{lvl:+g}: " + (f"{hit[0]:,} frames, {hit[1] / 60:.1f} min" if hit else "not reached")
                          for lvl, hit in hits)
        lines.append(f"{run}: {int(curve[0][-1]):,} frames in {curve[2][-1] / 60:.1f} min, final return "
                     f"{curve[1][-1]:.2f}" + (f"; {marks}" if marks else ""))
    return [*lines, f"wrote {out}.csv and {out}.png"]


def _plot(grid: np.ndarray, ret: np.ndarray, wall: np.ndarray, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(grid, ret.mean(0), label=f"mean of {len(ret)} run(s)")
    if len(ret) > 1:
        ax.fill_between(grid, ret.min(0), ret.max(0), alpha=0.25, label="min-max across seeds")
    ax.set_xlabel("emulator frames (agent steps x frameskip)")
    ax.set_ylabel("raw episode return (mean of last 100 episodes)")
    minutes = wall.mean(0) / 60
    if np.all(np.diff(minutes) > 0):  # the top axis needs time to grow with frames
        top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, grid, minutes),
                                                   lambda m: np.interp(m, minutes, grid)))
        top.set_xlabel("wall-clock minutes")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
