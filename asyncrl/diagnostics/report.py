"""`diagnosis.md`: a run's verdicts, problems, next steps and figures, as markdown."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from asyncrl.diagnostics.advice import next_steps
from asyncrl.diagnostics.bottleneck import (
    LABELS,
    REMEDIES,
    REPLAY_TRAINING,
    classify,
    dominant,
    solved_note,
    solved_return,
)
from asyncrl.diagnostics.health import Thresholds, critic_settle_updates, detect_over_run
from asyncrl.diagnostics.rundir import RunData

FIGURE_DIR = "diagnosis"
STAGE_KEYS = ("rollout_env_frac", "rollout_wait_frac", "policy_infer_frac", "policy_wait_frac",
              "learner_wait_frac", "learner_copy_frac", "learner_train_frac", "learner_forward_frac",
              "learner_backward_frac", "learner_optim_frac", "learner_insert_frac", "learner_sample_frac",
              "learner_update_frac")
OFF_POLICY_KEYS = (("utd_achieved", "achieved UTD (updates per env step)"), ("replay_size", "replay size"),
                   ("sample_age_mean", "sample age (transitions)"), ("q_mean", "Q estimate (mean)"),
                   ("q_return_mean", "observed return (mean)"), ("q_divergence", "Q divergence"))


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _median(records: Sequence[dict], key: str) -> float | None:
    xs = [r[key] for r in records if _num(r.get(key))]
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def status(run: RunData) -> str:
    """How the run ended, from its stop record (`stopped.json`, written as it closes its metrics) and last
    record; a run without one still runs, or was killed before it could write one (or predates the record)."""
    last, stopped = run.records[-1], run.stopped
    if last.get("fatal"):
        return f"stopped with an error: {last['fatal']}"
    if stopped is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stopped.get("stopped_at", 0)))
        return f"finished: stopped at {stopped.get('frames', last.get('frames', 0)):,} frames ({when})"
    interval = float(run.config.get("report_interval", 5.0))
    if run.metrics_age_s < 3 * interval + 10:
        return "running (no stop record yet; metrics written in the last few report intervals)"
    return "not running: no stop record (killed, or a run from before stop records) and no metrics for a while"


def device_used(run: RunData) -> str:
    """The device the run trained on: --device as given, or for `auto` what the run saw (a sampled GPU or none)."""
    device = str(run.config.get("device", "?"))
    if device != "auto":
        return device
    if run.config.get("serial"):  # the serial loop samples no GPU: nothing recorded says which one it used
        return "auto (not recorded by --serial runs)"
    gpu = any(_num(r.get("gpu_util")) for r in run.records)
    return f"{'cuda' if gpu else 'cpu'} (--device auto{'' if gpu else ': no GPU was in use'})"


def entropy_floor(records: Sequence[dict]) -> float | None:
    floors = [r["entropy_floor"] for r in records if _num(r.get("entropy_floor")) and r["entropy_floor"]]
    return floors[-1] if floors else None


def bottleneck_section(records: Sequence[dict], env: str = "") -> list[str]:
    """The run's dominant bottleneck and what would lift it; for a run that reached `env`'s solved return, that
    nothing needs to change."""
    steady = records[1:] if len(records) > 2 else records  # the first interval includes start-up
    kinds = [r.get("bottleneck") or (v.kind if (v := classify(r)) else None) for r in steady]
    kind = dominant(kinds)
    if kind is None:
        return ["Not enough stage timings yet to call a bottleneck."]
    counts = Counter(k for k in kinds if k)
    spread = ", ".join(f"{LABELS[k]} {n}" for k, n in counts.most_common())
    remedy = REPLAY_TRAINING if kind == "training" and _median(steady, "learner_update_frac") is not None \
        else REMEDIES[kind]
    remedy = solved_remedy(records, env) or remedy
    lines = [f"**{LABELS[kind]}** in {counts[kind]} of {sum(counts.values())} report intervals ({spread}).", "",
             f"What to do: {remedy}.", "", "| stage | median share of wall time |", "|---|---|"]
    for key in STAGE_KEYS:
        value = _median(steady, key)
        if value is not None:
            lines.append(f"| {key.removesuffix('_frac').replace('_', ' ')} | {100 * value:.0f}% |")
    reasons = [r.get("bottleneck_reason") for r in steady if r.get("bottleneck") == kind and r.get("bottleneck_reason")]
    if reasons:
        lines += ["", f"Latest evidence: {reasons[-1]}."]
    return lines


def solved_remedy(records: Sequence[dict], env: str) -> str:
    """`solved_note` for a run whose last mean return reached gymnasium's solved return for `env`, else ''."""
    threshold = solved_return(env) if env else None
    returns = [r["episode_return_mean"] for r in records if _num(r.get("episode_return_mean"))]
    if threshold is None or not returns or returns[-1] < threshold:
        return ""
    return solved_note(env, threshold, float(returns[-1]))


def thresholds(config: dict) -> Thresholds:
    """The run's health thresholds: its entropy floor is in the records, its Q-divergence alert in its config."""
    q_alert, gamma, tau = (config.get(k) for k in ("q_divergence_alert", "gamma", "tau"))
    th = Thresholds(q_divergence=float(q_alert)) if _num(q_alert) else Thresholds()
    if _num(gamma) and _num(tau):
        th = replace(th, q_divergence_min_updates=critic_settle_updates(float(gamma), float(tau)))
    return th


def problems_section(records: Sequence[dict], th: Thresholds | None = None) -> list[str]:
    th = th or Thresholds()
    alerts = detect_over_run(records, replace(th, entropy_floor=entropy_floor(records)))
    recorded = {code for r in records for code in r.get("alerts") or []}
    lines = [f"- **{a.code}**: {a.message} -> {a.fix}" for a in alerts.values()]
    lines += [f"- **{code}** (reported during the run)" for code in sorted(recorded - set(alerts))]
    fatal = [r["fatal"] for r in records if r.get("fatal")]
    if fatal:
        lines.insert(0, f"- **fatal**: {fatal[-1]}")
    return lines or ["None detected."]


def _over_run(records: Sequence[dict], key: str) -> list[float]:
    return [float(r[key]) for r in records if _num(r.get(key))]


def off_policy_section(records: Sequence[dict], th: Thresholds) -> list[str]:
    """Replay learners: UTD, replay size, sample age and Q divergence at the start, middle and end of the run."""
    if not _over_run(records, "replay_size"):
        return []
    lines = ["| figure | first | median | last |", "|---|---|---|---|"]
    for key, label in OFF_POLICY_KEYS:
        xs = _over_run(records, key)
        if xs:
            lines.append(f"| {label} (`{key}`) | {xs[0]:.3g} | {statistics.median(xs):.3g} | {xs[-1]:.3g} |")
        else:
            lines.append(f"| {label} (`{key}`) | - | - | - |")
    fired = detect_over_run(records, th).get("q_divergence") if th.q_divergence > 0 else None
    if fired is not None:
        lines += ["", f"Q-divergence alert: {fired.message} -> {fired.fix}."]
    elif _over_run(records, "q_divergence"):
        lines += ["", f"No Q-divergence alert (threshold {th.q_divergence:g} for {th.q_divergence_records} reports "
                      f"in a row, judged after {th.q_divergence_min_updates:,} updates)."]
    else:
        lines += ["", "No Q divergence measured: no episode completed in the replay buffer during updates."]
    return lines


def summary_section(run: RunData) -> list[str]:
    recs, cfg, last = run.records, run.config, run.records[-1]
    returns = [r["episode_return_mean"] for r in recs if _num(r.get("episode_return_mean"))]
    latest, best = (returns[-1], max(returns)) if returns else (None, None)
    rss = max((r["rss_mb_total"] for r in recs if _num(r.get("rss_mb_total"))), default=None)
    return [
        f"- env: `{cfg.get('env', '?')}`; {cfg.get('workers', '?')} rollout workers x "
        f"{cfg.get('envs_per_worker', '?')} envs, {cfg.get('policy_workers', '?')} policy worker(s), "
        f"batch {cfg.get('batch_size', '?')}, lr {cfg.get('lr', '?')}, device {device_used(run)}",
        f"- status: {status(run)}",
        f"- {last.get('frames', 0):,} frames in {_fmt(last.get('time'), '.0f')} s; median "
        f"{_fmt(_median(recs, 'fps'), ',.0f')} FPS; {len(recs)} reports",
        f"- episode return: latest {_fmt(latest)}, best {_fmt(best)}"
        f"; policy lag median {_fmt(_median(recs, 'policy_lag_mean'), '.2f')}; "
        f"peak RSS {_fmt(rss, ',.0f')} MB",
    ]


def build_markdown(run: RunData, figures: dict[str, str]) -> str:
    rel = {name: os.path.relpath(path, run.path) for name, path in figures.items()}
    records = run.records
    th = thresholds(run.config)
    off_policy = off_policy_section(records, th)
    parts = [f"# Diagnosis of `{run.path}`", "", *summary_section(run), "",
             "## Throughput bottleneck", "", *bottleneck_section(records, str(run.config.get("env", ""))), "",
             *(["## Replay and critics", "", *off_policy, ""] if off_policy else []),
             "## Problems detected", "", *problems_section(records, th), "",
             "## What to try next", "", *[f"{i}. {s}" for i, s in enumerate(
                 next_steps(records, entropy_floor(records)), 1)], ""]
    for title, name in (("Learning curve", "learning_curve"), ("Throughput and policy lag", "throughput"),
                        ("Health", "health"), ("Stage-time breakdown", "stages"),
                        ("Processes, queues, GPU", "resources")):
        if name in rel:
            parts += [f"## {title}", "", f"![{title}]({rel[name]})", ""]
    return "\n".join(parts)


def write_report(run: RunData) -> str:
    """Write RUN_DIR/diagnosis.md and its figures (RUN_DIR/diagnosis/*.png); return the markdown's path."""
    from asyncrl.diagnostics.plots import report_figures

    figures = report_figures(run.records, os.path.join(run.path, FIGURE_DIR), entropy_floor(run.records))
    path = os.path.join(run.path, "diagnosis.md")
    with open(path, "w") as f:
        f.write(build_markdown(run, figures))
    return path
