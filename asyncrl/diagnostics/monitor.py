"""The runner's always-on profiler and health monitor.

Every report interval the runner hands its metrics record to `RunMonitor.observe`, which adds queue lengths,
per-process RSS/CPU, GPU utilisation, the learner's forward/backward/optimizer split, the bottleneck verdict
and the health alerts; `flush` then prints the verdict when its kind differs from the one printed last (every
record still carries it) and any alert not printed before. Torch-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil

from asyncrl.agents.registry import OFF_POLICY
from asyncrl.config import Config
from asyncrl.diagnostics.bottleneck import classify, solved_note, solved_return
from asyncrl.diagnostics.health import Thresholds, critic_settle_updates, detect, entropy_floor
from asyncrl.diagnostics.resources import GpuSampler, ProcessSampler, summarize
from asyncrl.envs.base import EnvSpec

REPLAY_STAGES = ("insert", "sample", "update")  # the replay learners' parts of t_train (agents/off_policy/learner.py)
EARLY_RECORDS = 20  # kept for good: the detectors' baselines
RECENT_RECORDS = 500  # kept as a sliding window (a long run's history must not itself leak)
QUEUE_NAMES = ("requests", "full", "free", "reports")


def verdict_changed(last_printed: str | None, current: str | None) -> bool:
    """Whether to print the bottleneck line: there is a verdict and its kind differs from the last one printed
    (an interval without a verdict, e.g. while the learner has not reported yet, changes nothing)."""
    return current is not None and current != last_printed


class RunMonitor:
    def __init__(self, cfg: Config, spec: EnvSpec, out: Callable[..., None] = print, gpu: bool = True):
        """`gpu`: sample GPU utilisation with nvidia-smi (a child process per record; the serial loop starts none)."""
        self.cfg, self.out = cfg, out
        categorical = spec.discrete or spec.multi_discrete or (spec.is_tuple and not spec.gaussian_dims)
        self.thresholds = Thresholds(entropy_floor=entropy_floor(categorical, spec.num_actions),
                                     q_divergence=cfg.q_divergence_alert,
                                     q_divergence_min_updates=critic_settle_updates(cfg.gamma, cfg.tau))
        self.processes = ProcessSampler()
        psutil.cpu_percent(None)  # start the machine-wide CPU clock
        self.gpu = GpuSampler(enabled=gpu and cfg.device != "cpu", device=cfg.device)  # this run's GPU only
        self._queue_sums: dict[str, float] = {}
        self._queue_samples = 0
        self._early: list[dict[str, Any]] = []
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_RECORDS)
        self._printed: set[str] = set()
        self._pending: list[str] = []
        self._last_verdict: str | None = None  # the bottleneck kind last printed (printed again when it changes)
        self.solved_at = solved_return(cfg.env)  # gymnasium's solved return for the env (CartPole-v1: 475), or None
        self._solved_note = ""  # what the bottleneck line says once the run reached it
        self._samples_seen = self._samples_dropped = 0  # the learner's batches this launch, and their stale samples

    @property
    def history(self) -> list[dict[str, Any]]:
        return self._early + list(self._recent)

    def sample_queues(self, channels: Any) -> None:
        """Add one sample of each queue's length (called on every rollout report, ~1 Hz per worker)."""
        for name in QUEUE_NAMES:
            try:
                n = getattr(channels, name).qsize()
            except Exception:  # noqa: BLE001 - a statistic is never worth failing the run for
                continue
            self._queue_sums[name] = self._queue_sums.get(name, 0.0) + n
        self._queue_samples += 1

    def observe(self, record: dict[str, Any], learner_stats: Sequence[Mapping[str, float]],
                procs: Mapping[str, Any], channels: Any) -> dict[str, Any]:
        """The extra fields for this interval's record (call before the learner stats are cleared)."""
        self.sample_queues(channels)
        extra: dict[str, Any] = {f"queue_{k}": round(v / self._queue_samples, 2) for k, v in self._queue_sums.items()}
        self._queue_sums, self._queue_samples = {}, 0
        extra.update(self._learner_split(learner_stats))
        extra["entropy_floor"] = round(self.thresholds.entropy_floor or 0.0, 4)
        pids = {name: getattr(p, "pid", None) for name, p in procs.items()}
        sampled = self.processes.sample(pids)
        extra["procs"] = sampled
        extra.update(summarize(sampled))
        extra.update(self.gpu.sample())
        extra["cpu_system"] = psutil.cpu_percent(None)
        if "cpu_total" in extra:  # this run's share of the machine, comparable with cpu_system
            extra["cpu_run"] = round(extra["cpu_total"] / (psutil.cpu_count() or 1), 1)
        if self.cfg.algo not in OFF_POLICY:  # the bound past which the APPO learner drops samples
            extra["policy_lag_limit"] = self.cfg.max_policy_lag
        extra.update(self._dropped_share(learner_stats))
        verdict = classify({**record, **extra})
        extra["bottleneck"] = verdict.kind if verdict else None
        extra["bottleneck_reason"] = verdict.reason if verdict else None
        solved = self._solved(record.get("episode_return_mean"))
        key = None if verdict is None else verdict.kind + (" solved" if solved else "")
        if verdict is not None and verdict_changed(self._last_verdict, key):
            self._pending.append(f"  {verdict.line(solved)}")
            self._last_verdict = key
        if not self.history:  # where this launch's records begin (a resumed run appends to the same file)
            extra["launch_start"] = True
        full = {**record, **extra}
        (self._early if len(self._early) < EARLY_RECORDS else self._recent).append(full)
        alerts = detect(self.history, self.thresholds)
        extra["alerts"] = [a.code for a in alerts]
        for alert in alerts:
            if alert.code not in self._printed:
                self._printed.add(alert.code)
                self._pending.append(f"asyncrl: {alert.line()}")
        full["alerts"] = extra["alerts"]
        return extra

    def _dropped_share(self, stats: Sequence[Mapping[str, float]]) -> dict[str, float]:
        """`dropped_share`: the share of the samples the learner received this launch that it dropped as too stale.
        Counted from the learner's own batches: the env steps the runner has tallied lag behind the trajectories
        the learner already holds (a share of them reads above 100% early in a run)."""
        self._samples_seen += int(sum(s.get("samples", 0) for s in stats))
        self._samples_dropped += int(sum(s.get("dropped_stale", 0) for s in stats))
        if not self._samples_seen:
            return {}
        return {"dropped_share": round(self._samples_dropped / self._samples_seen, 4)}

    def _solved(self, ret: Any) -> str:
        """The bottleneck line's note from the first record whose mean return reached the env's solved return on
        ('' before; kept after, so a return that wavers around the threshold does not reprint the verdict)."""
        if not self._solved_note and self.solved_at is not None and isinstance(ret, int | float) \
                and ret >= self.solved_at:
            self._solved_note = solved_note(self.cfg.env, self.solved_at, float(ret))
        return self._solved_note

    def flush(self, verdict: bool = True) -> None:
        """Print a changed verdict (unless `verdict` is False) and new alerts (after the runner's progress line)."""
        for line in self._pending:
            if verdict or not line.startswith("  "):
                self.out(line, flush=True)
        self._pending = []

    def _learner_split(self, stats: Sequence[Mapping[str, float]]) -> dict[str, float]:
        """Gradient-norm peak, and forward/backward/optimizer (APPO) or insert/sample/update (replay learners)
        shares of the learner's wall time."""
        out: dict[str, float] = {}
        norms = [s["grad_norm"] for s in stats if "grad_norm" in s]
        if norms:
            out["grad_norm_max"] = max(norms)
        total = sum(s.get("t_wait", 0.0) + s.get("t_copy", 0.0) + s.get("t_train", 0.0) for s in stats)
        steps = self.cfg.epochs * self.cfg.minibatches
        if total > 0 and any("t_forward" in s for s in stats):
            for part in ("forward", "backward", "optim"):
                out[f"learner_{part}_frac"] = sum(s.get(f"t_{part}", 0.0) for s in stats) * steps / total
        if total > 0 and any("t_update" in s for s in stats):
            for part in REPLAY_STAGES:
                out[f"learner_{part}_frac"] = sum(s.get(f"t_{part}", 0.0) for s in stats) / total
        return out

    def fatal_record(self, payload: Mapping[str, Any], frames: int, env_steps: int, elapsed: float) -> dict:
        """A last metrics record for a run stopped by a component's fatal error."""
        code = payload.get("code")
        return {"time": round(elapsed, 3), "frames": frames, "env_steps": env_steps,
                "fatal": payload.get("message", ""), "alerts": [code] if code else []}
