"""The learner stage with its acting policy in the same process: what an in-process transport (`--serial`) trains,
acts, checkpoints and evaluates with, as the forked learner and evaluator processes do over shared memory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from asyncrl.agents.acting import published_actor
from asyncrl.agents.registry import learner_class, make_learner
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.host.seeding import write_initial_weights_checksum
from asyncrl.runtime.plumbing.run_error import RunError
from asyncrl.runtime.stages.evaluation import evaluate
from asyncrl.runtime.stages.learner_state import (
    NONFINITE_LIMIT,
    ResumeError,
    load_resume_state,
    nonfinite_message,
    set_up_torch,
    try_save,
)
from asyncrl.runtime.stages.learning import LearnerStage, LocalPublisher, staged_weights
from asyncrl.runtime.stages.runbook import RunBook, restore_totals, run_state
from asyncrl.runtime.store.best_checkpoint import read_best_return
from asyncrl.shm import SharedArrays


class LocalLearner:
    """The run's learner (resumed with --resume), its acting policy (`actor`, on `publisher`'s released version)
    and the learner stage over `traj`; the run book's totals follow them."""

    def __init__(self, cfg: Config, spec: EnvSpec, book: RunBook, out: Callable[..., None]):
        self.cfg, self.spec, self.book, self.out = cfg, spec, book, out
        self.device = set_up_torch(cfg, spec.batched)  # threads, determinism, seeds: as the learner process sets them
        self.learner = learner = make_learner(cfg, spec, self.device)
        self._warm_up()
        self.resumed_run = self._resume() if cfg.resume else {}
        learner.version = max(learner.version, 1)
        self.policy = learner_class(cfg.algo).build_policy(spec, cfg, self.device).eval()
        self.actor = published_actor(self.policy)
        self.publisher = LocalPublisher(learner.policy_module(), self.policy)
        self.publisher.publish(learner.version)
        self.publisher.release()
        if not cfg.resume:
            with contextlib.suppress(OSError):  # only a record for comparing runs
                write_initial_weights_checksum(cfg.run_dir, staged_weights(self.publisher))
        book.totals.policy_version = learner.version
        book.totals.expect_learner_stats(learner.stat_names)
        self.best, self.eval_done = read_best_return(cfg.run_dir), 0
        self.save_failed: str | None = None

    def _warm_up(self) -> None:
        """--compile learner|all: compile the update now, with a progress line (this engine's act stays eager)."""
        if not getattr(self.learner, "compiled", False):
            return
        from asyncrl.agents.compiled import CompileError, cache_dir

        self.out(f"asyncrl: compiling the learner's update (cache {cache_dir()})...", flush=True)
        try:
            seconds = self.learner.warm_up()
        except CompileError as exc:
            raise RunError(str(exc), hint=False, exit_code=2) from None
        self.out(f"asyncrl: learner's update compiled in {seconds or 0.0:.1f} s", flush=True)

    def _resume(self) -> dict:
        """The newest good checkpoint into the learner; the runner's counters it kept (`run`)."""
        book = self.book
        try:
            path, env_steps, run, _ = load_resume_state(self.cfg, self.learner, lambda msg: self.out(f"asyncrl: {msg}"))
        except ResumeError as exc:
            raise RunError(str(exc), hint=False) from None
        self.out(f"asyncrl: resumed from {path}", flush=True)
        book.totals.env_steps, book.t_start = env_steps, book.t_start - float(run.get("elapsed", 0.0))
        restore_totals(book.totals, run)
        return run

    def attach(self, traj: SharedArrays) -> None:
        self.stage = LearnerStage(self.spec, traj, self.device, [self.learner], [self.publisher],
                                  self.book.totals.env_steps)

    def update(self, slots: list[int]) -> None:
        """Train on the slots (counted only, when not training) and mark the new version due (in lockstep, release
        it); RunError once the updates have not been finite `NONFINITE_LIMIT` times in a row."""
        cfg, book, t0 = self.cfg, self.book, time.monotonic()
        if not cfg.train:  # sampling only: the slots go back untouched
            book.totals.add_learner({"samples": len(slots) * cfg.rollout * cfg.envs_per_split, "t_wait": 0.0,
                                     "t_copy": 0.0, "t_train": 0.0})
            return
        batch = self.stage.gather(slots)
        for stats in self.stage.train(batch, {"t_wait": 0.0, "t_copy": time.monotonic() - t0}):
            book.totals.add_learner(stats)
        if cfg.deterministic:  # lockstep: the next steps act on this version
            self.publisher.release()
        if self.learner.nonfinite_streak >= NONFINITE_LIMIT:
            book.fatal({"message": nonfinite_message(self.learner, batch), "code": "nonfinite"})
            raise RunError(nonfinite_message(self.learner, batch))

    def save(self, counters: dict[str, int]) -> dict | None:
        """A checkpoint as the learner process writes it; its "saved" record, or None when nothing was written."""
        book = self.book
        run = run_state(book.totals, time.time() - book.t_start, counters)
        kind, payload = try_save(self.cfg, [self.learner], self.publisher.tensors, book.totals.env_steps, run)
        if kind != "saved":
            self.save_failed = payload["message"] if kind == "save_failed" else self.save_failed
            more = "; training goes on, the previous checkpoints are kept" if kind == "save_failed" else ""
            self.out(f"asyncrl: {'warning: ' if more else ''}{payload['message']}{more}", flush=True)
            return None
        self.save_failed = None
        book.notify("checkpoint", dict(payload))
        return payload

    def evaluate(self, due: int) -> None:
        """An evaluation of the acting policy, played here (`runtime/roles/evaluator.py`'s episodes)."""
        book, reason = self.book, self.book.stop_reason
        self.eval_done = due
        result, self.best = evaluate(self.cfg, self.spec, self.policy, self.learner.version, due, self.best,
                                     lambda: book.stop_reason == reason, lambda msg: self.out(f"asyncrl: {msg}"))
        if result is not None:
            book.receive_eval(result)
