"""The serial transport (`--serial`): the forked engine's stages one after the other in this process, nothing
forked, so a debugger can step through a whole run. Slots circulate as in a forked run whose learner sets the pace
(`LocalSlots`): once every split waits for a free slot, the acting policy takes the version trained last and the
learner trains on the oldest batch while the next round still acts on the older one: each batch is acted on two
versions behind, as in a forked CartPole run (`lag 2.0/2`). `--deterministic` is lockstep (lag 0), as forked."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from asyncrl.config import Config
from asyncrl.diagnostics.metrics import MetricsWriter
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.wandb_logger import open_sinks
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.registry import state_layout
from asyncrl.runtime.plumbing.callbacks import Callback
from asyncrl.runtime.plumbing.local_slots import LocalSlots
from asyncrl.runtime.plumbing.run_error import RunError, checkpoint_hint
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, circulating_slots
from asyncrl.runtime.recovery.env_errors import InProcessEnvErrors
from asyncrl.runtime.stages.inference import InferenceStage
from asyncrl.runtime.stages.local_learner import LocalLearner
from asyncrl.runtime.stages.rollout import RolloutStage, StageFatal, episode_report
from asyncrl.runtime.stages.runbook import RunBook
from asyncrl.runtime.store.run_dir import prepare_run_dir


class SerialRun:
    """One `--serial` run: `run()` trains until a stop rule and returns the exit code."""

    def __init__(self, cfg: Config, out: Callable[..., None] = print, callbacks: Iterable[Callback] = (),
                 spec: EnvSpec | None = None):
        self.cfg, self.out = cfg, out
        self.spec = spec if spec is not None else make_env_spec(cfg)
        self.book = RunBook(cfg, self.spec, out, callbacks, RunMonitor(cfg, self.spec, out, gpu=False))
        self.errors = InProcessEnvErrors(cfg, out)
        self.local: LocalLearner | None = None
        self.rollout: RolloutStage | None = None

    def run(self) -> int:
        cfg, book = self.cfg, self.book
        prepare_run_dir(cfg, self.spec, self.out)
        book.open(MetricsWriter(cfg.run_dir, open_sinks(cfg)))
        try:
            self._start()
            self._loop()
            code, error, hint = 0, "", True
        except (StageFatal, RunError, OSError) as exc:
            code, error, hint = book.ending(exc)
        finally:
            book.shutting_down = True
            saved = self.local.save(self.errors.counters()) if self.local is not None else None  # the final one
            if self.rollout is not None:
                self.rollout.close()
            book.close()
        save_failed = self.local.save_failed if self.local is not None else None
        return book.conclude(code, error, checkpoint_hint(cfg.run_dir, saved) if hint else "", save_failed, saved)

    def _start(self) -> None:
        """The learner and its acting policy (`LocalLearner`), the slots, the stages and the envs' first rows."""
        cfg, spec = self.cfg, self.spec
        self.local = local = LocalLearner(cfg, spec, self.book, self.out)
        self.errors.count = int(local.resumed_run.get("env_errors", 0))
        self.traj = allocate_trajectories(cfg, spec, state_layout(cfg))  # anonymous memory: nothing to clean
        local.attach(self.traj)
        self.inference = InferenceStage(cfg, spec, self.traj, [local.actor], local.device)
        self.rollout = RolloutStage(cfg, self.traj, cfg.num_splits, 0, self.errors)
        self.rollout.make_envs()
        self.slots = LocalSlots(circulating_slots(cfg), cfg.num_splits)
        for split in range(cfg.num_splits):
            self.rollout.begin(split, self.slots.take())

    def _loop(self) -> None:
        book, start_steps = self.book, self.book.totals.env_steps
        book.start_loop()
        while book.stop_reason is None:
            self._round()
            self._between_rounds()
        while book.stop_reason == "frames" and self._learn():
            pass  # the whole batches collected before a --frames stop are trained on, as forked
        final = book.request_final_evaluation()
        if final is not None:
            self.local.evaluate(final)
        if book.tail_due():
            self._report(time.monotonic())
        self.out(f"stopping ({book.stop_reason}) after {book.totals.env_steps - start_steps:,} env steps")

    def _round(self) -> None:
        """One step of every split that holds a slot (their actions in one forward pass); a full slot queued for
        the learner, whose turn comes once every split waits for a free slot."""
        stage, totals = self.rollout, self.book.totals
        splits = self.slots.active()
        t0 = time.monotonic()
        samples = self.inference.serve(np.array([stage.slots[s] for s in splits]),
                                       np.array([stage.steps[s] for s in splits]), [self.local.publisher.version])
        t1 = time.monotonic()
        totals.add_policy({"batches": 1, "samples": samples, "t_infer": t1 - t0, "t_wait": 0.0, "t_total": t1 - t0})
        for split in splits:
            t0 = time.monotonic()
            stepped = stage.step(split)
            if stepped.full and (slot := self.slots.hand_in(split, stage.hand_over(split))) is not None:
                stage.take_over(split, slot)
            t1 = time.monotonic()
            totals.add_rollout({"env_steps": stepped.agent_steps, "env_errors": stepped.env_errors, "t_wait": 0.0,
                                "episodes": [episode_report(e) for e in stepped.finished], "t_env": t1 - t0,
                                "t_total": t1 - t0})
        if self.slots.stalled() or self.cfg.deterministic:  # lockstep: each whole batch at once, at lag 0
            self._learn()

    def _learn(self) -> bool:
        """Release the version trained last to the acting policy, train on the oldest batch and hand its slots to
        the waiting splits; False when no whole batch is queued."""
        slots = self.slots.batch(self.cfg.trajectories_per_batch)
        if slots is None:
            return False
        self.local.publisher.release()
        self._update(slots)
        for split, slot in self.slots.give_back(slots):
            self.rollout.take_over(split, slot)
        return True

    def _update(self, slots: list[int]) -> None:
        self.local.update(slots)
        if self.cfg.deterministic:  # as in lockstep: a record per update
            self._report(time.monotonic())

    def _between_rounds(self) -> None:
        """Stop rules, the env error rate, records, checkpoints and evaluations."""
        book, now = self.book, time.monotonic()
        self.errors.check(book.totals.env_steps, now)
        if book.report_due(now):
            self._report(now)
        if book.checkpoint_due(now):
            self.local.save(self.errors.counters())
        book.evaluation.tick(book.frames)
        due = book.evaluation_due(self.local.eval_done)
        if due is not None:
            self.local.evaluate(due)
        book.check_stop(now)

    def _report(self, now: float) -> None:
        book = self.book
        book.report(now, self.errors.counters(), lambda r: book.monitor.observe(r, book.totals.learner, {}, None),
                    self.rollout.tell_curricula, verdict=False)  # the verdict's remedies speak of processes
