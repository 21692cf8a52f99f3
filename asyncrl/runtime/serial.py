"""The serial transport (`--serial`): the forked engine's stages, one after the other in this one process.

Nothing is forked and no queue or shared-memory file is made, so a debugger can step through a whole run. The
rollout stage steps every split, the inference stage acts for all of them in one forward pass, the learner stage
trains on batches of full slots, and the run book keeps records, checkpoints, evaluations and stop rules, as in
the forked engine (`--resume` takes either engine's checkpoints).

Slots circulate as the forked engine's do when its learner sets the pace (a CartPole run's "training-bound"):
`circulating_slots` of them, a full slot queued for the learner, a split without a free slot waiting. Once every
split waits, the learner releases the version it trained last to the acting policy and trains on the oldest
batch, whose slots go back to the waiting splits; their next round still acts on the older version, as forked
workers keep stepping while the learner trains. So each batch is acted on by the policy two versions behind
the learner, the forked run's lag (`lag 2.0/2` in its progress line), not a lag of 0: with the presets' rates a
lag of 0 takes larger steps and learns CartPole on fewer seeds.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from asyncrl.agents.acting import published_actor
from asyncrl.agents.registry import learner_class, make_learner
from asyncrl.config import Config
from asyncrl.diagnostics.metrics import MetricsWriter
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.wandb_logger import open_sinks
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.registry import state_layout
from asyncrl.runtime.host.seeding import write_initial_weights_checksum
from asyncrl.runtime.plumbing.callbacks import Callback
from asyncrl.runtime.plumbing.eval_schedule import DUE
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, circulating_slots
from asyncrl.runtime.recovery.env_errors import InProcessEnvErrors
from asyncrl.runtime.recovery.supervisor import RunError, checkpoint_hint
from asyncrl.runtime.roles.evaluator import evaluate
from asyncrl.runtime.stages.inference import InferenceStage
from asyncrl.runtime.stages.learner_state import (
    NONFINITE_LIMIT,
    ResumeError,
    load_resume_state,
    nonfinite_message,
    set_up_torch,
    try_save,
)
from asyncrl.runtime.stages.learning import LearnerStage, LocalPublisher, staged_weights
from asyncrl.runtime.stages.rollout import RolloutStage, StageFatal, episode_report
from asyncrl.runtime.stages.runbook import RunBook, final_checkpoint_line, restore_totals, run_state
from asyncrl.runtime.store.best_checkpoint import read_best_return
from asyncrl.runtime.store.run_dir import prepare_run_dir


class SerialRun:
    """One `--serial` run: `run()` trains until a stop rule and returns the exit code."""

    def __init__(self, cfg: Config, out: Callable[..., None] = print, callbacks: Iterable[Callback] = (),
                 spec: EnvSpec | None = None):
        self.cfg, self.out = cfg, out
        self.spec = spec if spec is not None else make_env_spec(cfg)
        self.book = RunBook(cfg, self.spec, out, callbacks, RunMonitor(cfg, self.spec, out, gpu=False))
        self.errors = InProcessEnvErrors(cfg, out)
        self.learner, self.rollout, self.save_failed = None, None, None

    @property
    def stop_reason(self) -> str | None:
        return self.book.stop_reason

    def run(self) -> int:
        cfg, book = self.cfg, self.book
        prepare_run_dir(cfg, self.spec, self.out)
        book.metrics = MetricsWriter(cfg.run_dir, open_sinks(cfg))
        attached, code, error, hint, saved = book.attach(), 1, "", True, None
        try:
            self._start()
            self._loop()
            code = 0
        except StageFatal as exc:
            code, error = exc.exit_code, f"{exc}; stopping."
            book.fatal({"message": str(exc), "code": "env_broken"})
        except RunError as exc:
            code, error, hint = exc.exit_code, str(exc), exc.hint
        except OSError as exc:  # the train dir filled up or went away under metrics.jsonl
            error = f"cannot write to {cfg.run_dir} ({exc.strerror or exc}); stopped."
        finally:
            book.shutting_down = True
            saved = self._save() if self.learner is not None else None  # the final checkpoint
            book.evaluation.discard_staged()
            if self.rollout is not None:
                self.rollout.close()
            book.detach(attached)
            with contextlib.suppress(OSError):
                book.metrics.close()
        if not error and book.late_callback_error is not None:
            code, error, hint = 1, str(book.late_callback_error), book.late_callback_error.hint
        if error or self.save_failed:
            code = code or 1
            error = error or f"the final checkpoint was not saved ({self.save_failed})."
            self.out(f"asyncrl: error: {error} {checkpoint_hint(cfg.run_dir, saved) if hint else ''}".rstrip(),
                     file=sys.stderr)
        elif saved:
            self.out(final_checkpoint_line(saved, book.after_line()), flush=True)
        return code

    def _start(self) -> None:
        """The learner (resumed), the acting policy with its weights, the stages, the slots and the envs."""
        cfg, spec, book = self.cfg, self.spec, self.book
        self.device = set_up_torch(cfg)  # threads, determinism, seeds: as the learner process sets them
        learner = make_learner(cfg, spec, self.device)
        if cfg.resume:
            try:
                path, env_steps, run, _ = load_resume_state(cfg, learner, lambda msg: self.out(f"asyncrl: {msg}"))
            except ResumeError as exc:
                raise RunError(str(exc), hint=False) from None
            self.out(f"asyncrl: resumed from {path}", flush=True)
            book.totals.env_steps, book.t_start = env_steps, book.t_start - float(run.get("elapsed", 0.0))
            restore_totals(book.totals, run)
            self.errors.count = int(run.get("env_errors", 0))
        learner.version = max(learner.version, 1)
        self.learner, self.policy = learner, learner_class(cfg.algo).build_policy(spec, cfg, self.device).eval()
        self.publisher = LocalPublisher(learner.policy_module(), self.policy)
        self.publisher.publish(learner.version)
        self.publisher.release()
        if not cfg.resume:
            with contextlib.suppress(OSError):  # only a record for comparing runs
                write_initial_weights_checksum(cfg.run_dir, staged_weights(self.publisher))
        book.totals.policy_version = learner.version
        book.totals.expect_learner_stats(learner.stat_names)
        self.best, self.eval_done = read_best_return(cfg.run_dir), 0
        self.traj = traj = allocate_trajectories(cfg, spec, state_layout(cfg))  # anonymous memory
        self.inference = InferenceStage(cfg, spec, traj, [published_actor(self.policy)], self.device)
        self.learning = LearnerStage(spec, traj, self.device, [learner], [self.publisher], book.totals.env_steps)
        self.rollout = RolloutStage(cfg, traj, cfg.num_splits, 0, self.errors)
        self.rollout.make_envs()
        self.free, self.full, self.waiting = deque(range(circulating_slots(cfg))), deque(), []
        for split in range(cfg.num_splits):
            self.rollout.begin(split, self.free.popleft())

    def _loop(self) -> None:
        cfg, book, start_steps = self.cfg, self.book, self.book.totals.env_steps
        book.start_loop()
        self.mark = self.last_ckpt = time.monotonic()  # where the last stage's time was booked; the last save
        while book.stop_reason is None:
            self._round()
            self._between_rounds()
        if book.stop_reason == "frames":  # the whole batches collected before it are trained on, as forked
            while len(self.full) >= cfg.trajectories_per_batch and book.stop_reason == "frames":
                self._learn()
        if book.final_evaluation_due():
            book.evaluation.request_final(book.frames)
            self.out("final evaluation...", flush=True)
            self._evaluate(book.frames)
        if book.tail_due():
            self._report(time.monotonic())
        self.out(f"stopping ({book.stop_reason}) after {book.totals.env_steps - start_steps:,} env steps")

    def _round(self) -> None:
        """One step of every split that holds a slot: actions for all of them in one pass, then each split's envs;
        a full slot queued for the learner, and the learner's turn once every split waits for a free one."""
        stage, totals = self.rollout, self.book.totals
        splits = [s for s in range(self.cfg.num_splits) if s not in self.waiting]
        t0 = time.monotonic()
        samples = self.inference.serve(np.array([stage.slots[s] for s in splits]),
                                       np.array([stage.steps[s] for s in splits]), [self.publisher.version])
        t1 = time.monotonic()
        totals.add_policy({"batches": 1, "samples": samples, "t_infer": t1 - t0, "t_wait": 0.0, "t_total": t1 - t0})
        for split in splits:
            t0 = time.monotonic()
            stepped = stage.step(split)
            if stepped.full:
                self.full.append(stage.hand_over(split))
                self._next_slot(split)
            t1 = time.monotonic()
            totals.add_rollout({"env_steps": stepped.agent_steps, "env_errors": stepped.env_errors,
                                "episodes": [episode_report(e) for e in stepped.finished], "t_env": t1 - t0,
                                "t_wait": 0.0, "t_total": t1 - t0})
        if len(self.waiting) == self.cfg.num_splits:
            self._learn()

    def _next_slot(self, split: int) -> None:
        if self.free:
            self.rollout.take_over(split, self.free.popleft())
        else:
            self.waiting.append(split)

    def _learn(self) -> None:
        """Release the version trained last to the acting policy, train on the oldest batch, free its slots."""
        self.publisher.release()
        slots = [self.full.popleft() for _ in range(self.cfg.trajectories_per_batch)]
        self._update(slots)
        self.free.extend(slots)
        waiting, self.waiting = self.waiting, []
        for split in waiting:
            self._next_slot(split)

    def _update(self, slots: list[int]) -> None:
        cfg, book, t0 = self.cfg, self.book, time.monotonic()
        if not cfg.train:  # sampling only: the slots go back untouched
            book.totals.add_learner({"samples": len(slots) * cfg.rollout * cfg.envs_per_split, "t_wait": 0.0,
                                     "t_copy": 0.0, "t_train": 0.0})
            return
        batch = self.learning.gather(slots)
        for stats in self.learning.train(batch, {"t_wait": 0.0, "t_copy": time.monotonic() - t0}):
            book.totals.add_learner(stats)
        if self.learner.nonfinite_streak >= NONFINITE_LIMIT:
            book.fatal({"message": nonfinite_message(self.learner, batch), "code": "nonfinite"})
            raise RunError(nonfinite_message(self.learner, batch))
        if cfg.deterministic:  # as in lockstep: a record per update
            self._report(time.monotonic())

    def _between_rounds(self) -> None:
        """Stop rules, the env error rate, records, checkpoints and evaluations."""
        book, now = self.book, time.monotonic()
        self.errors.check(book.totals.env_steps, now)
        if book.report_due(now):
            self._report(now)
        if now - self.last_ckpt >= self.cfg.checkpoint_interval:
            self._save()
            self.last_ckpt = now
        book.evaluation.tick(book.frames)
        if book.evaluation.enabled and int(book.evaluation.request["due"][DUE]) > self.eval_done:
            self._evaluate(int(book.evaluation.request["due"][DUE]))
        book.check_stop(now)

    def _counters(self) -> dict[str, int]:
        return {"worker_restarts": 0, "policy_restarts": 0, "env_errors": self.errors.count}

    def _report(self, now: float) -> None:
        book = self.book
        book.report(now, self._counters(), lambda r: book.monitor.observe(r, book.totals.learner, {}, None),
                    self._share, verdict=False)  # the verdict's remedies speak of processes: recorded only

    def _share(self, info: dict) -> None:
        for env in self.rollout.envs:
            if env.wants_training_info:  # curriculum envs
                env.set_training_info(info)

    def _save(self) -> dict | None:
        """A checkpoint as the learner process writes it; its "saved" record, or None when nothing was written."""
        book = self.book
        run = run_state(book.totals, time.time() - book.t_start, self._counters())
        kind, payload = try_save(self.cfg, [self.learner], self.publisher.tensors, book.totals.env_steps, run)
        if kind != "saved":
            self.save_failed = payload["message"] if kind == "save_failed" else self.save_failed
            more = "; training goes on, the previous checkpoints are kept" if kind == "save_failed" else ""
            self.out(f"asyncrl: {'warning: ' if more else ''}{payload['message']}{more}", flush=True)
            return None
        self.save_failed = None
        book.notify("checkpoint", dict(payload))
        return payload

    def _evaluate(self, due: int) -> None:
        """An evaluation of the acting policy, played here (`runtime/roles/evaluator.py`'s episodes)."""
        book, reason = self.book, self.book.stop_reason
        self.eval_done = due
        result, self.best = evaluate(self.cfg, self.spec, self.policy, self.learner.version, due, self.best,
                                     lambda: book.stop_reason == reason, lambda msg: self.out(f"asyncrl: {msg}"))
        if result is not None:
            book.receive_eval(result)
