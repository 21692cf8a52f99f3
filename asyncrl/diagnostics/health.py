"""Training-health detectors: pure functions over the run's metrics records (oldest first).

Each detector looks at the newest record (with the earlier ones as a baseline) and returns an `Alert` while
its condition holds, or None. The runner calls `detect` every report interval and prints each alert code
once; `asyncrl-diagnose` calls it over a finished run. Thresholds are deliberately loose: a warning should
mean something is really wrong, not that a short run on a busy machine was noisy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.diagnostics.aggregate import RETURN_WINDOW

Record = dict[str, Any]

QUEUES = {  # metrics key -> (what it holds, who consumes it)
    "queue_requests": ("observation requests", "policy workers: add --policy-workers or use --device cuda"),
    "queue_full": ("full trajectories", "learner: it is training-bound, see the bottleneck verdict"),
    "queue_reports": ("statistics reports", "runner: raise --report-interval or reduce the number of workers"),
}


@dataclass(frozen=True)
class Alert:
    code: str  # short, stable: recorded in metrics.jsonl `alerts`
    message: str  # what was observed
    fix: str  # what to do (the user guide's remedy in asyncrl flags)

    def line(self) -> str:
        return f"warning [{self.code}]: {self.message} -> {self.fix}"


@dataclass(frozen=True)
class Thresholds:
    entropy_floor: float | None = None  # entropy below this is a collapse (see `entropy_floor`)
    kl_max: float = 0.1  # KL(behaviour || current) per sample; APPO usually stays below 0.02
    grad_spike: float = 10.0  # interval max gradient norm vs the median of earlier intervals
    value_growth: float = 100.0  # value loss vs its lowest earlier value
    fps_drop: float = 0.5  # recent FPS vs the run's early FPS
    queue_window: int = 6  # records over which a queue must keep growing
    memory_min_mb: float = 256.0  # growth in total RSS that counts as a leak (and 25% of the start)
    warmup_records: int = 2  # records skipped by the trend detectors after the launch's start-up (`steady_records`)
    startup_cap: int = 12  # records after sampling began that count as start-up at most (a run that never updates)
    progress_records: int = 10  # records with returns before "returns not rising" is judged
    q_divergence: float = 1.0  # off-policy critics overestimating the observed returns by this fraction (0: off)
    q_divergence_records: int = 3  # consecutive records above it before the alert
    q_divergence_min_updates: int = 0  # gradient updates before it is judged (`critic_settle_updates`)
    core_saturation: float = 0.2  # share of an LSTM's stored cell units beyond the learner's SATURATED_CELL
    stale_share: float = 0.2  # share of the run's env steps dropped as staler than --max-policy-lag


def entropy_floor(discrete: bool, num_actions: int) -> float:
    """Collapse level for the initial policy's family: 5% of the uniform entropy ln(n) for categorical
    policies; for diagonal Gaussians (initial std 1) the entropy of stds shrunk 20-fold."""
    if discrete:
        return 0.05 * math.log(max(num_actions, 2))
    return num_actions * (0.5 * math.log(2 * math.pi * math.e) - math.log(20.0))


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _series(records: Sequence[Record], key: str) -> list[float]:
    return [float(r[key]) for r in records if _finite(r.get(key))]


def nonfinite(records: Sequence[Record], th: Thresholds) -> Alert | None:
    last = records[-1]
    before = records[-2].get("nonfinite_updates", 0) if len(records) > 1 else 0
    skipped = (last.get("nonfinite_updates") or 0) - (before or 0)
    bad = [k for k in ("policy_loss", "value_loss", "grad_norm", "entropy", "kl", "episode_return_mean")
           if isinstance(last.get(k), float) and not math.isfinite(last[k])]
    if skipped <= 0 and not bad and not last.get("fatal"):
        return None
    parts = [f"{skipped} update(s) with a NaN/Inf loss or gradient were skipped"] if skipped > 0 else []
    if bad:
        parts.append(f"non-finite {', '.join(bad)}")
    if "episode_return_mean" in bad:
        parts.append("the env returns NaN/Inf rewards")
    return Alert("nonfinite", "; ".join(parts) or str(last.get("fatal")),
                 "check the env's rewards and observations for NaN/Inf, lower --lr, keep gradient clipping "
                 "(--max-grad-norm), try --normalize-obs")


def entropy_collapse(records: Sequence[Record], th: Thresholds) -> Alert | None:
    h = records[-1].get("entropy")
    if th.entropy_floor is None or not _finite(h) or h >= th.entropy_floor:
        return None
    return Alert("entropy_collapse", f"policy entropy {h:.3g} fell below {th.entropy_floor:.3g} (the policy "
                 "has become deterministic)", "raise --entropy-coeff, lower --lr")


def kl_high(records: Sequence[Record], th: Thresholds) -> Alert | None:
    kl = records[-1].get("kl")
    if not _finite(kl) or kl <= th.kl_max:
        return None
    return Alert("kl_high", f"KL between acting and learning policy {kl:.3g} > {th.kl_max:g}",
                 "lower --lr, fewer --epochs, smaller --clip-ratio, lower --max-policy-lag")


def grad_spike(records: Sequence[Record], th: Thresholds) -> Alert | None:
    earlier = _series(records[:-1], "grad_norm")
    last = records[-1]
    peak = last.get("grad_norm_max", last.get("grad_norm"))
    if len(earlier) < 3 or not _finite(peak):
        return None
    ref = statistics.median(earlier)
    if ref <= 0 or peak <= th.grad_spike * ref:
        return None
    return Alert("grad_spike", f"gradient norm {peak:.3g} is {peak / ref:.0f}x its usual {ref:.3g}",
                 "lower --lr or --max-grad-norm, scale or clip rewards, try --normalize-obs")


def value_exploding(records: Sequence[Record], th: Thresholds) -> Alert | None:
    losses = _series(records, "value_loss")
    if len(losses) < 3 or not _finite(records[-1].get("value_loss")):
        return None
    last, low = losses[-1], min(losses[:-1])
    if not (last > th.value_growth * max(low, 1e-8) and last > losses[-2]):
        return None
    return Alert("value_exploding", f"value loss {last:.3g} is {last / max(low, 1e-8):.0f}x its lowest "
                 f"({low:.3g}) and still rising", "lower --lr, scale or clip rewards, lower --value-coeff")


def _moved_index(records: Sequence[Record], key: str, since: int = 0) -> int | None:
    """Index of the first record after `since` whose `key` moved past its value at `since` (None: never, no key)."""
    first = records[since].get(key)
    if not _finite(first):
        return None
    return next((i for i in range(since + 1, len(records))
                 if _finite(records[i].get(key)) and records[i][key] > first), None)


def steady_records(records: Sequence[Record], th: Thresholds) -> Sequence[Record]:
    """The records after this launch's start-up, which the trend detectors judge. Start-up lasts until the learner
    published its first update (`policy_version` moved), at most `startup_cap` records after sampling began
    (`frames` moved), then `warmup_records` more: until then the slots fill, processes fault in their buffers and
    the first update compiles, so memory, queues and throughput ramp up without anything being wrong. Measured on
    Pong at nice 19: total RSS rose 1,106 -> 1,870 MB over the first 90 s and then held; the queue of full
    trajectories went 0 -> 4 while the first update ran. A resumed run starts its records at its checkpoint."""
    if not records:
        return records
    sampled = _moved_index(records, "frames")
    if sampled is None:
        return records[:0] if _finite(records[0].get("frames")) else records[th.warmup_records:]
    if not _finite(records[sampled].get("policy_version")):  # records without versions: from the first samples
        return records[sampled + th.warmup_records:]
    updated = _moved_index(records, "policy_version", since=sampled)  # (a resumed run loads its version earlier)
    end = sampled + th.startup_cap if updated is None else min(updated, sampled + th.startup_cap)
    return records[end + th.warmup_records:]


def _rate(records: Sequence[Record]) -> float | None:
    """Frames per second between the first and last record (robust to bursty single intervals)."""
    a, b = records[0], records[-1]
    if not all(_finite(r.get(k)) for r in (a, b) for k in ("frames", "time")) or b["time"] <= a["time"]:
        return None
    return (b["frames"] - a["frames"]) / (b["time"] - a["time"])


def fps_degrading(records: Sequence[Record], th: Thresholds) -> Alert | None:
    steady = [r for r in steady_records(records, th) if not r.get("fatal")]
    if len(steady) < 8:
        return None
    early, recent = _rate(steady[: len(steady) // 2]), _rate(steady[-max(3, len(steady) // 4):])
    if early is None or recent is None or early <= 0 or recent >= th.fps_drop * early:
        return None
    return Alert("fps_degrading", f"throughput fell from {early:,.0f} to {recent:,.0f} FPS",
                 "look for growing memory or queues, other jobs on the machine (per-process CPU% in "
                 "metrics.jsonl), or an env that slows down over time")


def _keeps_growing(values: list[float]) -> bool:
    """Never falling, rising in all but one step, and by at least 3 and half the start (a queue that sat empty and
    then filled once is not growing)."""
    steps = [b - a for a, b in zip(values, values[1:])]
    rising = all(d >= 0 for d in steps) and sum(d > 0 for d in steps) >= len(steps) - 1
    return rising and values[-1] >= values[0] + max(3.0, 0.5 * values[0])


def queue_growing(records: Sequence[Record], th: Thresholds) -> Alert | None:
    window = steady_records(records, th)[-th.queue_window:]
    if len(window) < th.queue_window:
        return None
    for key, (what, consumer) in QUEUES.items():
        values = _series(window, key)
        if len(values) == th.queue_window and _keeps_growing(values):
            return Alert("queue_growing", f"the queue of {what} keeps growing ({values[0]:.0f} -> "
                         f"{values[-1]:.0f})", f"its consumer falls behind, the {consumer}")
    return None


def memory_growing(records: Sequence[Record], th: Thresholds) -> Alert | None:
    """Total RSS mostly rising, by more than `memory_min_mb` and a quarter of the start, and still rising in the
    later half of the steady records by at least a third of the growth: a leak climbs at a steady rate, while the
    working set of a run that is still warming up (buffers faulted in on first use) levels off."""
    rss = _series(steady_records(records, th), "rss_mb_total")
    if len(rss) < 6:
        return None
    start = min(rss[:3])
    growth = rss[-1] - start
    steps = [b - a for a, b in zip(rss, rss[1:])]
    mostly_up = sum(s >= 0 for s in steps) >= 0.8 * len(steps)
    still_rising = rss[-1] - rss[len(rss) // 2] >= growth / 3
    if not (mostly_up and still_rising and growth > max(th.memory_min_mb, 0.25 * start)):
        return None
    return Alert("memory_growing", f"total RSS grew from {start:,.0f} to {rss[-1]:,.0f} MB and keeps rising "
                 "(a leak)", "see which process grows (procs in metrics.jsonl); save often and --resume "
                 "while you find it")


def returns_flat(records: Sequence[Record], th: Thresholds) -> Alert | None:
    """Returns no higher late in the run than early, counted from the first update (an off-policy warm-up of
    random actions, `updates_total` 0, is not expected to improve). Where records count episodes, judged only once
    the late third's means are over other games than the early third's (`RETURN_WINDOW` episodes apart): a mean
    over the same games cannot rise (a resumed run repeats its checkpoint's mean until new games end; a Pong game
    takes ~3,000 steps, so 50 s of a run is a handful of games)."""
    judged = [r for r in records if r.get("updates_total") != 0 and _finite(r.get("episode_return_mean"))]
    returns = _series(judged, "episode_return_mean")
    if len(returns) < th.progress_records:
        return None
    third = len(returns) // 3
    early_end, late_start = judged[third - 1].get("episodes"), judged[-third].get("episodes")
    if _finite(early_end) and _finite(late_start) and late_start - early_end < RETURN_WINDOW:
        return None
    early, late = statistics.fmean(returns[:third]), statistics.fmean(returns[-third:])
    if late > early + 0.05 * abs(early) + 1e-9:
        return None
    return Alert("returns_flat", f"episode return is not rising ({early:.3g} -> {late:.3g})",
                 "if the value loss is not falling check the data pipeline; if entropy is low raise "
                 "--entropy-coeff / lower --lr; otherwise tune hyperparameters or train longer (asyncrl-diagnose)")


def critic_settle_updates(gamma: float, tau: float) -> int:
    """Gradient updates before a critic's estimates are judged: `1 / ((1 - gamma) tau)`, the time a Polyak
    target (rate tau) takes to carry values over the discount horizon 1 / (1 - gamma); 20,000 for 0.99 and
    0.005. Before that a critic initialised near 0 lies above negative returns without overfitting anything."""
    if gamma >= 1.0 or tau <= 0.0:
        return 0
    return math.ceil(1.0 / ((1.0 - gamma) * tau))


def q_divergence(records: Sequence[Record], th: Thresholds) -> Alert | None:
    """Off-policy critics whose estimates stay above the returns the replay data got (see algo/q_divergence):
    the last `q_divergence_records` measurements (the check runs once per report) all above the threshold,
    after `q_divergence_min_updates` updates."""
    measured = [r for r in records if _finite(r.get("q_divergence"))][-th.q_divergence_records:]
    if th.q_divergence <= 0 or len(measured) < th.q_divergence_records:
        return None
    values = [float(r["q_divergence"]) for r in measured]
    settled = (measured[0].get("updates_total") or 0) >= th.q_divergence_min_updates
    if min(values) <= th.q_divergence or not settled:
        return None
    utd = measured[-1].get("utd_achieved")
    at_utd = f" at UTD {utd:.3g}" if _finite(utd) else ""
    return Alert("q_divergence", f"critics overestimate the observed returns by {values[-1]:.0%}{at_utd} for "
                 f"{len(values)} reports (q_divergence > {th.q_divergence:g}): the UTD is too high for the critics, "
                 "they overfit the replay data",
                 "lower --utd, use more critics with a min over a subset (--algo redq), add layer norm or "
                 "weight decay to the critics, or reset them periodically")


def core_saturated(records: Sequence[Record], th: Thresholds) -> Alert | None:
    """An LSTM whose cells have run away (`core_saturation`: the share of the stored cell units beyond |c| > 10).
    Measured on Pong without --normalize-returns (value targets near -2): the encoder's features grew from an RMS
    of 0.3 to 1.5-24.5, a quarter to a third of the cells counted up by one a step (|c| in the hundreds, tanh(c)
    stuck at +-1), and the value and the policy stopped following the frames (0.23-0.35 of the cells); with returns
    normalised later (0.00 at 0.4M frames, 0.385 at 1.68M). A GRU's value learned as fast as feed-forward's.
    On CartPole (targets near 100) 0.96 ran away and the run learned anyway: a warning, not a stop. What pulled
    them away is the value head's offset from the targets: with --center-values none ran away on Pong."""
    share = records[-1].get("core_saturation")
    if not _finite(share) or share <= th.core_saturation:
        return None
    return Alert("core_saturated", f"{share:.0%} of the LSTM's cell units have run away (|c| > 10 in the stored "
                 "states: they count instead of remembering, and pass no gradient)",
                 "--center-values (the value head's offset from the returns pulls the cells away; on Pong none "
                 "ran away with it), or --rnn gru")


def stale_dropped(records: Sequence[Record], th: Thresholds) -> Alert | None:
    """More than `stale_share` of the samples the learner received dropped as too stale (--max-policy-lag): the
    record's `dropped_share`, or for a record without one its dropped samples over its env steps."""
    last = records[-1]
    share, dropped = last.get("dropped_share"), last.get("dropped_stale")
    if not _finite(share):
        steps = last.get("env_steps")
        if not _finite(dropped) or not _finite(steps) or steps <= 0:
            return None
        share = min(1.0, dropped / steps)
    if share <= th.stale_share:
        return None
    limit = last.get("policy_lag_limit")
    bound = "" if limit is None else f" (--max-policy-lag {limit})"
    count = f" ({int(dropped):,} samples)" if _finite(dropped) else ""
    return Alert("stale_dropped", f"{share:.0%} of the samples were dropped{count} as staler than the lag bound"
                 f"{bound}: that experience was collected and thrown away",
                 "raise --max-policy-lag (4 by default), or shorten the lag: fewer envs in flight (--workers, "
                 "--envs-per-worker, --rollout) or a bigger --batch-size")


DETECTORS: tuple[Callable[[Sequence[Record], Thresholds], Alert | None], ...] = (
    nonfinite, entropy_collapse, kl_high, grad_spike, value_exploding, fps_degrading, queue_growing,
    memory_growing, returns_flat, q_divergence, core_saturated, stale_dropped,
)
CODES = ("nonfinite", "entropy_collapse", "kl_high", "grad_spike", "value_exploding", "fps_degrading",
         "queue_growing", "memory_growing", "returns_flat", "q_divergence", "core_saturated",
         "stale_dropped")


def detect(records: Sequence[Record], th: Thresholds | None = None) -> list[Alert]:
    """Alerts that hold at the newest record."""
    if not records:
        return []
    th = th or Thresholds()
    return [a for a in (d(records, th) for d in DETECTORS) if a is not None]


def _launch_began(record: Record) -> bool:
    """The monitor's mark of a launch's first record (`launch_start`), or in records from before it, the first
    sample of every process (`procs` CPU% is None only at a process's first sample)."""
    if "launch_start" in record:
        return bool(record["launch_start"])
    procs = record.get("procs")
    return bool(procs) and isinstance(procs, dict) and all(
        isinstance(p, dict) and p.get("cpu", 0) is None for p in procs.values())


def launches(records: Sequence[Record]) -> list[Sequence[Record]]:
    """A run's records split where a launch began (a resumed run appends to the same metrics.jsonl)."""
    starts = [i for i, r in enumerate(records) if i and _launch_began(r)]
    return [records[a:b] for a, b in zip([0, *starts], [*starts, len(records)])]


def detect_over_run(records: Sequence[Record], th: Thresholds | None = None,
                    max_points: int = 300) -> dict[str, Alert]:
    """First alert of each kind over a whole run (what `asyncrl-diagnose` reports), by code, each launch judged on
    its own records as the monitor judged it; a long launch is checked at `max_points` evenly spaced records (and
    the last)."""
    found: dict[str, Alert] = {}
    for launch in launches(records):
        n = len(launch)
        for i in sorted({*range(1, n + 1, max(1, n // max_points)), n}) if n else []:
            for alert in detect(launch[:i], th):
                found.setdefault(alert.code, alert)
    return found
