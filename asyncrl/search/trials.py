"""Run a search: each trial's seeds as asyncrl-train runs side by side, at most `slots` trials at once, their
metrics reported to the pruner at fixed frame marks, a pruned trial stopped with SIGINT (the run's own clean stop,
as Ctrl-C: it saves a final checkpoint)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from asyncrl.forked_run import ForkedRun
from asyncrl.search.progress import MetricsTail, score
from asyncrl.search.spec import SearchSpec
from asyncrl.search.study import group_dir, owner, require_optuna, retry, suggest
from asyncrl.sweep import SHARED_CORES, RunPlan, cores_per_run, flag_args, last_line, start_run

POLL_S = 0.1  # CartPole runs pass 10,000 frames in a quarter second: a pruned run stops soon after its mark


@dataclass
class Run:
    plan: RunPlan
    proc: ForkedRun
    log: IO[str]
    tail: MetricsTail


@dataclass
class Active:
    trial: Any  # optuna.Trial
    params: dict[str, Any]
    runs: list[Run]
    t0: float = field(default_factory=time.monotonic)
    mark: int = 0  # the last frame mark reported
    pruned_at: int | None = None
    last_value: float = float("nan")  # the last value reported to the pruner

    def alive(self) -> list[Run]:
        return [r for r in self.runs if r.proc.poll() is None]


def trial_name(number: int) -> str:
    return f"trial-{number:04d}"


def trial_plans(spec: SearchSpec, number: int, params: dict[str, Any], share: int) -> list[RunPlan]:
    """One run per seed in TRAIN_DIR/GROUP/trial-NNNN/trial-NNNN_seedS, like a grid setting's."""
    flags = {**spec.base, **params}
    for name in SHARED_CORES:
        flags.setdefault(name, share)
    setting = trial_name(number)
    parent = os.path.join(group_dir(spec), setting)
    plans = []
    for seed in spec.seeds:
        name = f"{setting}_seed{seed}"
        args = [a for k, v in flags.items() for a in flag_args(k, v)]
        args += ["--seed", str(seed), "--train-dir", parent, "--experiment", name]
        plans.append(RunPlan(name, setting, seed, os.path.join(parent, name), args))
    return plans


def describe(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


class Search:
    """The loop of one search process; `run()` returns its exit code (0 done, 1 a trial failed, 130 stopped)."""

    def __init__(self, spec: SearchSpec, study: Any, slots: int, entry: Callable[[list[str]], int],
                 cores: int | None = None, out: Callable[..., None] = print) -> None:
        """`entry`: asyncrl-train's command-line entry, which each run calls in a fork of this process."""
        self.spec, self.study, self.slots, self.entry, self.out = spec, study, slots, entry, out
        self.share = cores_per_run(slots * len(spec.seeds), cores)
        self.active: list[Active] = []
        self.failed = 0
        self.stop = False
        self.optuna = require_optuna()

    # ----- the loop -----
    def run(self) -> int:
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            while True:
                if not self.stop:
                    self._fill()
                if not self.active:
                    break
                time.sleep(POLL_S)
                for a in list(self.active):
                    if self._advance(a):
                        self.active.remove(a)
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.stop:
            return 130
        return 1 if self.failed else 0

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        """Ctrl-C: start no more trials; stop the running ones (a terminal's Ctrl-C reaches them too)."""
        if not self.stop:
            self.out("asyncrl-sweep: stopping; the running trials stop and are asked again when the search resumes",
                     flush=True)
        self.stop = True
        for a in self.active:
            for r in a.alive():
                r.proc.send_signal(signal.SIGINT)

    def counts(self) -> tuple[int, int]:
        """(finished trials, running trials) in the study, this process's and others'. Finished: complete, pruned,
        or failed on its own (a run that exits non-zero: counted, so a setting that always fails cannot make the
        search go on for ever); an interrupted trial is not, its settings are asked again."""
        states = self.optuna.trial.TrialState
        trials = self.study.get_trials(deepcopy=False)
        running = sum(t.state == states.RUNNING for t in trials)
        finished = sum(t.state in (states.COMPLETE, states.PRUNED)
                       or (t.state == states.FAIL and "error" in t.user_attrs) for t in trials)
        return finished, running

    def _fill(self) -> None:
        while len(self.active) < self.slots and not self.stop:
            finished, running = self.counts()
            if finished + running >= self.spec.trials:
                return
            trial = self.study.ask()
            trial.set_user_attr("owner", owner())
            params = suggest(trial, self.spec.ranges)
            plans = trial_plans(self.spec, trial.number, params, self.share)
            trial.set_user_attr("runs", [p.run_dir for p in plans])
            runs = []
            for p in plans:
                proc, log = start_run(p, self.entry)
                runs.append(Run(p, proc, log, MetricsTail(p.run_dir, self.spec.objective.metric)))
            self.active.append(Active(trial, params, runs))
            if self.stop:  # SIGINT came while these runs were starting: they stop too
                self._on_sigint(signal.SIGINT, None)
            retry_of = trial.user_attrs.get("retry_of")
            again = f" (again: trial {retry_of} was interrupted)" if retry_of is not None else ""
            self.out(f"[{finished + running + 1}/{self.spec.trials}] start {trial_name(trial.number)}{again}: "
                     f"{describe(params)}, {len(runs)} seed(s), {self.share} core(s) each", flush=True)

    # ----- one trial -----
    def _advance(self, a: Active) -> bool:
        """Read the trial's metrics, report the frame marks all its seeds passed, prune; True once it ended."""
        for r in a.runs:
            r.tail.poll()
        if a.pruned_at is None and not self.stop:
            self._report(a)
        if a.alive():
            return False
        for r in a.runs:
            r.log.close()
            r.tail.poll()
        self._finish(a)
        return True

    def _report(self, a: Active) -> None:
        every, obj = self.spec.pruner.every, self.spec.objective
        while True:
            mark = a.mark + every
            if min(r.tail.frames for r in a.runs) < mark:
                return
            a.mark = mark
            values = [score(r.tail.points, obj.last, mark) for r in a.runs]
            if any(v is None for v in values):
                continue
            a.last_value = sum(values) / len(values)
            a.trial.report(a.last_value, mark)
            if a.trial.should_prune():
                a.pruned_at = mark
                for r in a.alive():
                    r.proc.send_signal(signal.SIGINT)
                return

    def _finish(self, a: Active) -> None:
        states, trial, name = self.optuna.trial.TrialState, a.trial, trial_name(a.trial.number)
        took = time.monotonic() - a.t0
        steps = sum(r.tail.frames for r in a.runs)
        trial.set_user_attr("env_steps", steps)
        trial.set_user_attr("stopped_frames", max(r.tail.frames for r in a.runs))
        if a.pruned_at is not None:
            trial.set_user_attr("pruned_at", a.pruned_at)
            self.study.tell(trial, state=states.PRUNED)
            self.out(f"  pruned  {name} at {a.pruned_at:,} frames ({took:.0f} s): {a.last_value:.4g}", flush=True)
            return
        budget = int(self.spec.base["frames"])
        if self.stop and not all(r.proc.returncode == 0 and r.tail.frames >= budget for r in a.runs):
            trial.set_user_attr("interrupted", True)
            retry(self.study, trial.number, a.params)
            self.out(f"  stopped {name} at {steps:,} env steps: failed, its settings asked again on resume",
                     flush=True)
            return
        bad = [r for r in a.runs if r.proc.returncode != 0]
        values = [score(r.tail.points, self.spec.objective.last) for r in a.runs]
        if bad or any(v is None for v in values):
            self.failed += 1
            why = (f"{bad[0].plan.name} exit {bad[0].proc.returncode}: {last_line(bad[0].plan.run_dir + '.log')}"
                   if bad else f"no record with {self.spec.objective.metric} in its metrics.jsonl")
            trial.set_user_attr("error", why)
            self.study.tell(trial, state=states.FAIL)
            self.out(f"  FAILED  {name} ({took:.0f} s): {why}", flush=True)
            return
        trial.set_user_attr("seed_values", values)
        value = sum(values) / len(values)
        self.study.tell(trial, value)
        self.out(f"  done    {name} ({took:.0f} s): {self.spec.objective.metric} {value:.4g}", flush=True)
