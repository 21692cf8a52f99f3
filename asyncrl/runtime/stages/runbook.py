"""The run book: a run's records, stop rules, callbacks and evaluation schedule, kept the same way by every engine.

The engine's transport feeds it (totals from the stages' reports, counters, where the evaluation results come
from) and asks it what to do next: whether a stop is due (`check_stop`), when to write a record (`report`), what
a checkpoint keeps (`run_state`). It writes the metrics records and the progress line and calls the user's
callbacks; it knows nothing of processes. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from asyncrl.config import Config
from asyncrl.diagnostics.aggregate import Totals
from asyncrl.diagnostics.metrics import MetricsWriter
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.progress import ProgressLine
from asyncrl.diagnostics.thread_errors import route_to
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.host.signals import GROUP_STOP_SIGNALS
from asyncrl.runtime.plumbing.callbacks import Callback, Callbacks
from asyncrl.runtime.plumbing.eval_schedule import DUE, FINAL_EVAL_REASONS, RESULT_KEYS, EvalSchedule
from asyncrl.runtime.plumbing.run_error import RunError
from asyncrl.runtime.stages.rollout import StageFatal


def mean_last(values: deque, n: int | None = None) -> float | None:
    """Mean of the newest `n` values (all kept when None; fewer while fewer exist); None when empty."""
    if not values:
        return None
    last = list(values)[-n:] if n else values
    return sum(last) / len(last)


def interval_record(totals: Totals, spec: EnvSpec, elapsed: float, dt: float, steps: int) -> dict:
    """A metrics record's run totals, rates over the interval (`steps` env steps in `dt` s), the learner's stats,
    the env's episode metrics and the stage shares."""
    t, fs = totals, spec.frameskip
    record: dict = {
        "time": round(elapsed, 3),
        "frames": t.env_steps * fs,
        "env_steps": t.env_steps,
        "fps": steps * fs / dt,
        "sps": steps / dt,
        "episodes": t.episodes,
        "episodes_truncated": t.episodes_truncated,
        "truncations_unbootstrapped": t.truncations_unbootstrapped,
        "episode_return_mean": mean_last(t.returns),
        "episode_return_mean_20": mean_last(t.returns, 20),
        "episode_len_mean": mean_last(t.lengths),
        "policy_version": t.policy_version,
        "dropped_stale": t.dropped_stale,
        "learner_updates": len(t.learner),
    }
    record.update(t.learner_record())
    record.update(t.policy_records())
    record.update(t.info_record())
    record.update(t.stage_fractions())
    return record


def run_state(totals: Totals, elapsed: float, counters: dict[str, int]) -> dict:
    """The counters a checkpoint keeps (`run`), so a resumed run's metrics continue, its time included."""
    t = totals
    return {"elapsed": elapsed, "episodes": t.episodes, "dropped_stale": t.dropped_stale,
            "episodes_truncated": t.episodes_truncated,
            "returns": list(t.returns), "lengths": list(t.lengths), **counters}


def restore_totals(totals: Totals, run: dict) -> None:
    """Continue a checkpoint's episode counters and rolling episode means (`run_state`) in `totals`."""
    totals.episodes += int(run.get("episodes", 0))
    totals.episodes_truncated += int(run.get("episodes_truncated", 0))
    totals.dropped_stale += int(run.get("dropped_stale", 0))
    totals.returns.extend(run.get("returns", []))  # the rolling episode means continue too
    totals.lengths.extend(run.get("lengths", []))


def final_checkpoint_line(saved: dict, after: str = "") -> str:
    """The last line of a run that ended well: its final checkpoint (a "saved" report: path, version, env_steps)."""
    return (f"asyncrl: final checkpoint {os.path.basename(saved['path'])} (policy version {saved['version']}, "
            f"{saved['env_steps']:,} env steps){after}")


class RunBook:
    """One run's book: totals, records, stop rules, callbacks and the evaluation schedule."""

    def __init__(self, cfg: Config, spec: EnvSpec, out: Callable[..., None], callbacks: Iterable[Callback],
                 monitor: RunMonitor):
        self.cfg, self.spec, self.out, self.monitor = cfg, spec, out, monitor
        self.callbacks = Callbacks(callbacks)  # asyncrl.train(callbacks=...): called in the caller's process
        self.totals = Totals()
        self.progress = ProgressLine(cfg.frames, cfg.seconds)
        self.dashboard: Any = None  # the live screen (asyncrl.diagnostics.dashboard) once a record is shown on a TTY
        self.dashboard_decided = False
        self.evaluation = EvalSchedule(cfg)  # --eval-every: requests, and results for the metrics records
        self.metrics: MetricsWriter | None = None
        self.stop_reason: str | None = None
        self.t_signal: float | None = None  # time.monotonic() of the first stop signal
        self.shutting_down = False
        self.late_callback_error: RunError | None = None  # raised by a callback while the run shut down
        self.metrics_records = 0
        self.t_start = time.time()  # wall time the run's elapsed time counts from (earlier on a resume)
        self.t_loop = self.last_report = self.last_checkpoint = time.monotonic()
        self.last_printed = 0.0
        self.interval_steps = 0  # the env steps at the last record

    # ----- the run's lifetime -----
    def open(self, metrics: MetricsWriter) -> None:
        """The run starts writing `metrics`; signals and other threads' errors are the run's (`attach`)."""
        self.metrics = metrics
        self.attached = self.attach()

    def close(self) -> None:
        """After the shutdown: staged evaluation files of an evaluation stopped part-way go, the handlers that were
        there before come back, and the metrics sinks close."""
        self.evaluation.discard_staged()
        self.stop_dashboard()
        self.detach(self.attached)
        with contextlib.suppress(OSError):
            self.metrics.close()

    # ----- signals and stops -----
    def attach(self) -> tuple[dict, Callable[[], None]]:
        """For the run's duration: stop signals set `stop_reason` (where this thread may set handlers), and another
        thread's exception is one warning line (`thread_errors.route_to`). What `detach` restores."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in GROUP_STOP_SIGNALS}
        return previous, route_to(self.out)

    @staticmethod
    def detach(attached: tuple[dict, Callable[[], None]]) -> None:
        previous, stop_routing = attached
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_routing()

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name
            self.t_signal = time.monotonic()

    @property
    def frames(self) -> int:
        return self.totals.env_steps * self.spec.frameskip

    def frames_done(self) -> bool:
        return bool(self.cfg.frames) and self.frames >= self.cfg.frames

    def start_loop(self) -> None:
        self.t_loop = self.last_report = self.last_checkpoint = time.monotonic()
        self.interval_steps = self.totals.env_steps

    def check_stop(self, now: float, frames: bool = True) -> None:
        """--frames (unless `frames` is False: lockstep checks it after each update) and --seconds."""
        if self.stop_reason is not None:
            return
        if frames and self.frames_done():
            self.stop_reason = "frames"
        elif self.cfg.seconds and now - self.t_loop >= self.cfg.seconds:
            self.stop_reason = "seconds"

    def request_final_evaluation(self) -> int | None:
        """--eval-every: after a stop by --frames, --seconds or a callback the final weights are evaluated; the
        frames it is due at, or None."""
        if not self.evaluation.enabled or self.stop_reason not in FINAL_EVAL_REASONS:
            return None
        self.evaluation.request_final(self.frames)
        self.out("final evaluation...", flush=True)
        return self.frames

    def evaluation_due(self, done: int) -> int | None:
        """--eval-every: the frames of an evaluation due since the one at `done` frames (an in-process evaluator)."""
        if not self.evaluation.enabled:
            return None
        due = int(self.evaluation.request["due"][DUE])
        return due if due > done else None

    def checkpoint_due(self, now: float) -> bool:
        """A periodic checkpoint every --checkpoint-interval seconds of the loop."""
        if now - self.last_checkpoint < self.cfg.checkpoint_interval:
            return False
        self.last_checkpoint = now
        return True

    def report_due(self, now: float) -> bool:
        return now - self.last_report >= self.cfg.report_interval and not self.cfg.deterministic

    def tail_due(self, force: bool = False) -> bool:
        """A last record for the tail of the run, so the final totals are always in metrics.jsonl (in lockstep
        every update has its record)."""
        tail = (self.totals.env_steps > self.interval_steps or force) and not self.cfg.deterministic
        return tail or self.metrics_records == 0 or self.evaluation.pending

    def ending(self, exc: Exception) -> tuple[int, str, bool]:
        """(exit code, one-line error, whether a checkpoint hint follows) of an exception that ended the run: a
        RunError, a stage's `StageFatal` (recorded as the run's last record) or an OSError of the run directory."""
        if isinstance(exc, StageFatal):
            self.fatal({"message": str(exc), "code": "env_broken"})
            return exc.exit_code, f"{exc}; stopping.", True
        if isinstance(exc, RunError):
            return exc.exit_code, str(exc), exc.hint
        reason = getattr(exc, "strerror", None) or exc  # the train dir filled up or went away under metrics.jsonl
        return 1, f"cannot write to {self.cfg.run_dir} ({reason}); stopped.", True

    def conclude(self, code: int, error: str, hint: str, save_failed: str | None, saved: dict | None) -> int:
        """Say how the run ended, once it has shut down: its error (`hint`: which checkpoint remains), a final
        checkpoint that could not be saved, or the final checkpoint (`saved`); the exit code."""
        late = self.late_callback_error
        if not error and late is not None:
            code, error, hint = 1, str(late), hint if late.hint else ""
        if error or save_failed:
            error = error or f"the final checkpoint was not saved ({save_failed})."
            self.out(f"asyncrl: error: {error}{' ' + hint if hint else ''}", file=sys.stderr)
            return code or 1
        if saved:
            after = "" if self.t_signal is None else (
                f"; stopped {time.monotonic() - self.t_signal:.1f} s after {self.stop_reason}")
            self.out(final_checkpoint_line(saved, after), flush=True)
        return code

    # ----- callbacks -----
    def notify(self, event: str, record: dict) -> None:
        """Pass an event to the user's callbacks; one returning False stops the run as a signal would."""
        if not self.callbacks:
            return
        try:
            go_on = self.callbacks(event, record)
        except RunError as exc:
            if not self.shutting_down:
                raise
            self.late_callback_error = self.late_callback_error or exc
            return
        if not go_on and self.stop_reason is None:
            self.stop_reason = "callback"

    def receive_eval(self, result: dict) -> None:
        self.evaluation.receive(result)
        self.notify("eval", {k: result[k] for k in RESULT_KEYS if k in result})

    # ----- records -----
    def report(self, now: float, counters: dict, observe: Callable[[dict], dict],
               share: Callable[[dict], None], extra: dict | None = None, verdict: bool = True,
               show: bool = True) -> dict:
        """Write the interval's metrics record (the monitor's `observe` adds its fields; `share` passes the
        progress to curriculum envs), call the callbacks, print the progress line (`show`: this process's line is
        the run's) and the monitor's alerts."""
        t, cfg = self.totals, self.cfg
        record = interval_record(t, self.spec, time.time() - self.t_start, max(now - self.last_report, 1e-6),
                                 t.env_steps - self.interval_steps)
        record.update(extra or {})
        record.update(counters)
        record.update(observe(record))
        share({"frames": record["frames"], "env_steps": t.env_steps, "policy_version": t.policy_version,
               "episode_return_mean": record["episode_return_mean"]})
        t.learner = []
        record.update(self.evaluation.pop_results())
        assert self.metrics is not None
        self.metrics.write(record, step=record["frames"])
        self.notify("metrics", record)
        for video in self.evaluation.pop_videos():
            self.metrics.write_video("eval_video", video["gif"], video["video"], step=record["frames"])
        self.metrics_records += 1
        self.last_report, self.interval_steps = now, t.env_steps
        quiet = time.monotonic() - self.last_printed < cfg.report_interval and not self.frames_done()
        if cfg.deterministic and quiet:  # a record per update; a progress line per report interval
            self.monitor.flush(verdict=False)
            return record
        self.last_printed = time.monotonic()
        if show and self.show_dashboard():
            self.dashboard.update(record, now - self.t_loop)
        elif show:
            self.out(self.progress.line(record, now - self.t_loop), flush=True)
        self.monitor.flush(verdict=verdict)
        return record

    def show_dashboard(self) -> bool:
        """Whether this record goes to the live dashboard (started at the first record shown: --dashboard and
        stdout a terminal) rather than the progress line."""
        if self.dashboard is None and not self.dashboard_decided and not self.shutting_down and self.out is print:
            from asyncrl.diagnostics.dashboard import wanted

            self.dashboard_decided = True  # stdout does not become a terminal later
            if wanted(self.cfg):
                from asyncrl.diagnostics.dashboard import Dashboard

                self.dashboard = Dashboard(self.cfg)
                self.dashboard.start()
        return self.dashboard is not None

    def stop_dashboard(self) -> None:
        """Leave the dashboard's last frame on the terminal; what follows prints as lines again."""
        if self.dashboard is not None:
            self.dashboard.stop()

    def fatal(self, payload: dict) -> None:
        """The last record of a run stopped by an error (`payload`: message and code)."""
        t = self.totals
        record = self.monitor.fatal_record(payload, self.frames, t.env_steps, time.time() - self.t_start)
        assert self.metrics is not None
        self.metrics.write(record, step=record["frames"])
