"""The serial loop (`--serial`): env stepping, inference and learning one after the other in this one process.

Nothing is forked and no child process, queue or shared-memory file is made, so a debugger can step through a
whole run, and it runs where forking is impossible. It is built from the forked engine's parts, not its process
loops:

- envs: one `VecEnv` per worker split (`make_vec_env`, --workers x --worker-splits of them), seeded as the rollout
  workers seed theirs; the trajectory slots laid out as `runtime/plumbing/trajectories.py` lays them out (one slot
  per split at a time), kept in this process's memory;
- acting: the policy the learner publishes (`Learner.build_policy`), through the acting contract
  (`agents/acting.py`), on a copy of the learner's weights taken after every update, as a policy worker reads
  them; one forward pass per step for every env of every split;
- learning: the learner `--algo` names (`agents/registry.py`) on `gather_batch` batches of
  `trajectories_per_batch` full slots;
- around them, the runner's run-dir checks, metrics records, progress line, checkpoints (same schedule, same
  contents: `--resume` takes them, forked or serial), evaluation and stop rules.

A step for every split, `--rollout` times, fills the slots; the full ones go to the learner a batch at a time, and
fresh slots take over from their last observation. The slots' rows follow the rollout worker's bookkeeping:
episode starts (`first`), the final observation of a truncated env (`final_obs`/`final_step`), steps left out of
training (`valid`: an env instance that raised, a row a NEXT_STEP backend spent on its own reset).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import NoReturn

import numpy as np
import torch

from asyncrl.agents.acting import published_actor
from asyncrl.agents.batch import gather_batch
from asyncrl.agents.registry import learner_class, make_learner
from asyncrl.config import Config
from asyncrl.diagnostics.aggregate import Totals
from asyncrl.diagnostics.metrics import MetricsWriter
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.progress import ProgressLine
from asyncrl.diagnostics.wandb_logger import open_sinks
from asyncrl.envs.base import EnvBroken, EnvInfoError, EpisodeStats, VecEnv
from asyncrl.envs.dict_obs import ArrayDict, zeros_like
from asyncrl.envs.registry import make_env_spec, make_vec_env
from asyncrl.models.actor_critic import flat_state
from asyncrl.models.obs import obs_from_numpy
from asyncrl.models.registry import state_layout
from asyncrl.runtime.host.seeding import write_initial_weights_checksum
from asyncrl.runtime.plumbing.callbacks import Callback, Callbacks
from asyncrl.runtime.plumbing.eval_schedule import DUE, FINAL_EVAL_REASONS, RESULT_KEYS, EvalSchedule
from asyncrl.runtime.plumbing.trajectories import (
    NO_FINAL,
    allocate_trajectories,
    circulating_slots,
    obs_arrays,
    state_arrays,
)
from asyncrl.runtime.recovery.rollout_guard import split_seed
from asyncrl.runtime.recovery.supervisor import (
    CHECK_EVERY_S,
    ENV_ERROR_PRINT_EVERY_S,
    EnvErrorRate,
    RunError,
    checkpoint_hint,
)
from asyncrl.runtime.roles.evaluator import evaluate
from asyncrl.runtime.roles.learner import (
    NONFINITE_LIMIT,
    NOT_FINITE_SAVE,
    ResumeError,
    load_resume_state,
    nonfinite_message,
    save_failed_message,
    save_learner,
    set_up_torch,
)
from asyncrl.runtime.roles.process import GROUP_STOP_SIGNALS
from asyncrl.runtime.roles.rollout_worker import _keep_final_obs, skip_reset_rows
from asyncrl.runtime.roles.runner import (
    final_checkpoint_line,
    interval_record,
    prepare_run_dir,
    restore_totals,
    run_state,
)
from asyncrl.runtime.store.best_checkpoint import read_best_return


class SerialRun:
    """One `--serial` run: `run()` trains until a stop rule and returns the exit code (`stop_reason` says why)."""

    def __init__(self, cfg: Config, out: Callable[..., None] = print, callbacks: Iterable[Callback] = ()):
        self.cfg, self.out = cfg, out
        self.callbacks = Callbacks(callbacks)
        self.spec = make_env_spec(cfg)
        self.stop_reason: str | None = None
        self.t_signal: float | None = None  # time.monotonic() of the first stop signal
        self.totals = Totals()
        self.monitor = RunMonitor(cfg, self.spec, out, gpu=False)  # nvidia-smi would be a child process
        self.progress = ProgressLine(cfg.frames, cfg.seconds)
        self.evaluation = EvalSchedule(cfg)
        self.error_rate = EnvErrorRate(cfg)
        self.env_errors = 0
        self.last_env_error: dict | None = None
        self.last_saved: dict | None = None
        self.save_failed: str | None = None
        self.error_printed = -1e9  # time.monotonic() of the last env error line
        self.late_error: RunError | None = None  # raised by a callback at the final checkpoint
        self.envs: list[VecEnv] = []
        self.learner = None
        self.ready = False  # the learner holds its (resumed) weights: a final checkpoint is due at any stop

    # ----- lifecycle -----
    def run(self) -> int:
        cfg = self.cfg
        prepare_run_dir(cfg, self.spec, self.out)
        self.metrics = MetricsWriter(cfg.run_dir, open_sinks(cfg))
        in_main = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
        previous = {sig: signal.signal(sig, self._on_signal) for sig in GROUP_STOP_SIGNALS} if in_main else {}
        self.t_start = time.time()
        code, error, hint = 1, "", True
        try:
            self._start()
            self._loop()
            code = 0
        except RunError as exc:
            code, error, hint = exc.exit_code, str(exc), exc.hint
        except OSError as exc:  # the train dir filled up or went away under metrics.jsonl
            error = f"cannot write to {cfg.run_dir} ({exc.strerror or exc}); stopped."
        finally:
            saved = self._save(final=True) if self.ready else None  # the final checkpoint, as at the runner's stop
            self.evaluation.discard_staged()  # an evaluation stopped part-way staged files for nothing
            for env in self.envs:
                env.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            try:
                self.metrics.close()
            except OSError:
                pass
        if not error and self.late_error is not None:
            code, error, hint = 1, str(self.late_error), self.late_error.hint
        if error:
            more = f" {checkpoint_hint(cfg.run_dir, saved)}" if hint else ""
            self.out(f"asyncrl: error: {error}{more}", file=sys.stderr)
        elif self.save_failed:
            self.out(f"asyncrl: error: the final checkpoint was not saved ({self.save_failed}). "
                     f"{checkpoint_hint(cfg.run_dir)}", file=sys.stderr)
            code = 1
        elif saved:
            after = "" if self.t_signal is None else (
                f"; stopped {time.monotonic() - self.t_signal:.1f} s after {self.stop_reason}")
            self.out(final_checkpoint_line(saved, after), flush=True)
        return code

    def _on_signal(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name
            self.t_signal = time.monotonic()

    def _start(self) -> None:
        """The learner (resumed), the acting policy with its weights, the slots and the envs' first observations."""
        cfg, spec = self.cfg, self.spec
        self.device = set_up_torch(cfg)  # threads, determinism, seeds: as the learner process sets them
        self.learner = learner = make_learner(cfg, spec, self.device)
        if cfg.resume:
            try:
                path, env_steps, run, _ = load_resume_state(cfg, learner, lambda msg: self.out(f"asyncrl: {msg}"))
            except ResumeError as exc:
                raise RunError(str(exc), hint=False) from None
            self.out(f"asyncrl: resumed from {path}", flush=True)
            self.totals.env_steps = env_steps
            self.t_start -= float(run.get("elapsed", 0.0))
            restore_totals(self.totals, run)
            self.env_errors = int(run.get("env_errors", 0))
        learner.version = max(learner.version, 1)
        self.policy = learner_class(cfg.algo).build_policy(spec, cfg, self.device).eval()  # as a policy worker's
        self.actor = published_actor(self.policy)
        self.published = list(zip(flat_state(self.policy), flat_state(learner.policy_module())))
        self._publish()
        self.ready = True
        if not cfg.resume:
            flat = torch.cat([src.detach().reshape(-1).float().cpu() for _, src in self.published]).numpy()
            try:
                write_initial_weights_checksum(cfg.run_dir, flat)
            except OSError:
                pass  # only a record for comparing runs
        self.totals.policy_version = learner.version
        self.totals.expect_learner_stats(learner.stat_names)
        self.best = read_best_return(cfg.run_dir)
        self.eval_done = 0
        self._make_slots()
        self._make_envs()

    def _make_slots(self) -> None:
        cfg = self.cfg
        self.traj = allocate_trajectories(cfg, self.spec, state_layout(cfg))  # anonymous memory: nothing to clean
        traj = self.traj
        self.obs, self.final_obs = obs_arrays(traj, "obs"), obs_arrays(traj, "final_obs")
        self.first, self.valid, self.state = traj["first"], traj["valid"], state_arrays(traj)
        layout = self.actor.state_layout()
        if set(layout) != set(self.state):
            raise RuntimeError(f"the slots hold the state {sorted(self.state)}, the actor's is {sorted(layout)}")
        splits = cfg.num_splits
        self.slots = np.arange(splits)  # each split's slot
        self.free = deque(range(splits, circulating_slots(cfg)))
        self.full: list[int] = []
        self.final_scratch = [zeros_like(self.obs[0, 0]) for _ in range(splits)]
        # the row that starts a split's next slot (bootstrap observation, episode starts, the actor's state)
        self.carry_obs = zeros_like(self.obs[0, 0])
        self.carry_first = np.zeros_like(self.first[0, 0])
        self.carry_state = [np.zeros_like(a[0, 0]) for a in self.state.values()]

    def _make_envs(self) -> None:
        cfg = self.cfg
        try:
            self.envs = [make_vec_env(cfg, cfg.envs_per_split, training=True) for _ in range(cfg.num_splits)]
        except Exception as exc:
            self._fatal(f"env {cfg.env} could not be created: {type(exc).__name__}: {exc}")
        self.split_errors = [0] * cfg.num_splits  # new seeds after each error, as a rollout worker's
        for split, env in enumerate(self.envs):
            env.info_keys = cfg.info_key_names
            self._reset(split, self.slots[split], 0)

    def _reset(self, split: int, slot: int, t: int) -> None:
        """Reset the split's envs into row t of its slot: every env starts an episode there."""
        try:
            self.envs[split].reset(seed=split_seed(self.cfg, split, errors=self.split_errors[split]),
                                   obs_out=self.obs[slot, t])
        except EnvBroken as exc:
            self._fatal(str(exc))
        except Exception as exc:  # a backend that cannot replace one env: no episode can start
            self._fatal(f"{self.cfg.env} env failed before its first step: {type(exc).__name__}: {exc}")
        if t == 0:
            self.traj["final_step"][slot] = NO_FINAL
        self.first[slot, t] = True

    # ----- the loop -----
    def _loop(self) -> None:
        cfg, t = self.cfg, 0
        start_steps = self.totals.env_steps
        now = self.t_loop = self.last_report = self.last_printed = self.last_ckpt = self.last_check = time.monotonic()
        self.policy_mark = self.rollout_mark = self.last_update = now  # where each stage's time was last booked
        self.interval_steps, self.metrics_records = self.totals.env_steps, 0
        while self.stop_reason is None:
            self._act(t)
            for split, slot in enumerate(self.slots):
                self._step(split, int(slot), t)
            t += 1
            if t == cfg.rollout:
                self._hand_over()
                t = 0
            self._between_steps()
        self._final_evaluation()
        tail = self.totals.env_steps > self.interval_steps and not cfg.deterministic  # lockstep: a record per update
        if tail or self.metrics_records == 0 or self.evaluation.pending:
            self._report(time.monotonic())  # the tail's record: the final totals are always in metrics.jsonl
        self.out(f"stopping ({self.stop_reason}) after {self.totals.env_steps - start_steps:,} env steps")

    def _act(self, t: int) -> None:
        """Step t's actions for every env of every split, in one forward pass (a policy worker's batch)."""
        spec, slots, traj = self.spec, self.slots, self.traj
        t0 = time.monotonic()
        rows = self.obs[slots, t]  # [splits, envs per split, ...] gathered copies
        flat = (ArrayDict({k: a.reshape(-1, *a.shape[2:]) for k, a in rows.items()}) if isinstance(rows, ArrayDict)
                else rows.reshape(-1, *rows.shape[2:]))
        shape = (len(slots), self.cfg.envs_per_split)
        with torch.inference_mode():
            obs = obs_from_numpy(flat, self.device)
            if self.state:  # each env's state and episode start at this step; its state after it goes to row t + 1
                before = {k: torch.from_numpy(a[slots, t]).flatten(0, 1).to(self.device) for k, a in self.state.items()}
                starts = torch.from_numpy(self.first[slots, t]).flatten().to(self.device)
                actions, logp, after = self.actor.act(obs, before, starts)
                for k, a in self.state.items():
                    a[slots, t + 1] = after[k].cpu().numpy().reshape(*shape, *a.shape[3:])
            else:
                actions, logp, _ = self.actor.act(obs, {}, None)
        traj["actions"][slots, t] = actions.cpu().numpy().reshape(*shape, *spec.action_shape)
        traj["logp"][slots, t] = logp.cpu().numpy().reshape(shape)
        traj["versions"][slots, t] = self.learner.version
        t1 = time.monotonic()
        self.totals.add_policy({"batches": 1, "samples": shape[0] * shape[1], "t_infer": t1 - t0,
                                "t_wait": t0 - self.policy_mark, "t_total": t1 - self.policy_mark})
        self.policy_mark = t1

    def _step(self, split: int, slot: int, t: int) -> None:
        """Step one split's envs with step t's actions, writing row t (and the observation at t + 1) of its slot."""
        traj, env = self.traj, self.envs[split]
        terminated, truncated, valid, first = traj["terminated"], traj["truncated"], self.valid, self.first
        t0 = time.monotonic()
        valid[slot, t] = True
        steps, errors = self.cfg.envs_per_split, 0
        try:
            finished = env.step(traj["actions"][slot, t], self.obs[slot, t + 1], traj["rewards"][slot, t],
                                terminated[slot, t], truncated[slot, t], self.final_scratch[split])
        except EnvInfoError as exc:  # bad input: a metric that is not a number
            self._fatal(str(exc), exit_code=2)
        except EnvBroken as exc:  # a fresh instance failed before its first step
            self._fatal(str(exc))
        except Exception as exc:  # a backend that cannot replace one env: the step is lost, the split starts afresh
            finished, steps, errors = [], 0, self.cfg.envs_per_split  # not counted, as a rollout worker's
            self.split_errors[split] += 1
            self._env_error(f"{type(exc).__name__}: {exc}", "step", errors, split, "reset the split's envs (the "
                            "step left out of training)")
            valid[slot, t] = terminated[slot, t] = truncated[slot, t] = False
            traj["rewards"][slot, t] = 0.0
            self._reset(split, slot, t + 1)
        else:
            np.logical_or(terminated[slot, t], truncated[slot, t], out=first[slot, t + 1])  # episode ends -> starts
            skipped = env.skipped
            if skipped is not None and skipped.any():  # the env's own reset (NEXT_STEP): no agent step
                steps -= skip_reset_rows(skipped, valid[slot, t], first[slot, t + 1])
            faults = getattr(env, "faults", None)
            if faults:  # env instances the backend replaced
                errors = self._replaced(split, slot, t, faults)
            if finished:
                _keep_final_obs(slot, t, truncated, self.final_scratch[split], self.final_obs, traj["final_step"])
        t1 = time.monotonic()
        self.totals.add_rollout({"env_steps": steps, "env_errors": errors, "episodes": [_episode(e) for e in finished],
                                 "t_env": t1 - t0, "t_wait": t0 - self.rollout_mark, "t_total": t1 - self.rollout_mark})
        self.rollout_mark = t1

    def _replaced(self, split: int, slot: int, t: int, faults: list) -> int:
        """Env instances the split's backend replaced in step t (`RolloutGuard.replaced`): a failed step is left out
        of training, and the fresh instance's first observation starts an episode. Returns their count."""
        for fault in faults:
            self.first[slot, t + 1, fault.index] = True
            if fault.where == "step":
                self.valid[slot, t, fault.index] = False
        count, last = len(faults), faults[-1]
        self.split_errors[split] += count
        self._env_error(last.message, last.where, count, split,
                        f"replaced env {split * self.cfg.envs_per_split + last.index} with a fresh instance (its "
                        f"episode dropped{', the step left out of training' if last.where == 'step' else ''})")
        faults.clear()
        return count

    def _env_error(self, message: str, where: str, count: int, split: int, action: str) -> None:
        self.env_errors += count
        self.last_env_error = {"message": message, "where": where, "worker": "serial"}
        now = time.monotonic()
        if now - self.error_printed >= ENV_ERROR_PRINT_EVERY_S:
            self.error_printed = now
            self.out(f"asyncrl: split {split}: env raised {message} in {where}; {action} ({self.env_errors} env "
                     f"errors; the run stops above --max-env-error-rate {self.cfg.max_env_error_rate:g})", flush=True)

    def _hand_over(self) -> None:
        """The slots are full. Split by split, as rollout workers hand theirs over: the row that starts the next
        trajectory is copied out, the slot goes to the learner (an update once a batch is full, which frees its
        slots) and a free slot takes over from the copied row."""
        cfg, state = self.cfg, list(self.state.values())
        for split, slot in enumerate(self.slots.tolist()):
            self.carry_obs[...] = self.obs[slot, cfg.rollout]  # the bootstrap observation starts the next one
            self.carry_first[...] = self.first[slot, cfg.rollout]
            for kept, a in zip(self.carry_state, state):
                kept[...] = a[slot, cfg.rollout]
            self.full.append(slot)
            if len(self.full) == cfg.trajectories_per_batch:
                self._update(self.full)
                self.free.extend(self.full)
                self.full = []
            new = self.slots[split] = self.free.popleft()
            self.obs[new, 0] = self.carry_obs
            self.first[new, 0] = self.carry_first
            for kept, a in zip(self.carry_state, state):
                a[new, 0] = kept
            self.traj["final_step"][new] = NO_FINAL

    def _update(self, slots: list[int]) -> None:
        cfg, learner = self.cfg, self.learner
        t0 = time.monotonic()
        if not cfg.train:  # sampling only: the slots go back untouched
            self.totals.add_learner({"samples": len(slots) * cfg.rollout * cfg.envs_per_split, "t_wait": 0.0,
                                     "t_copy": 0.0, "t_train": 0.0})
            return
        batch = gather_batch(self.traj, np.asarray(slots, dtype=np.int64), learner.version, self.device)
        t1 = time.monotonic()
        stats = learner.train(batch, learner.samples_trained * self.spec.frameskip)
        self._publish()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.monotonic()
        stats.update(t_wait=t0 - self.last_update, t_copy=t1 - t0, t_train=t2 - t1)
        self.last_update = t2
        self.totals.add_learner(stats)
        if learner.nonfinite_streak >= NONFINITE_LIMIT:
            self._fatal(nonfinite_message(learner, batch), code="nonfinite")
        if cfg.deterministic:  # as in lockstep: a record per update
            self._report(time.monotonic())

    def _publish(self) -> None:
        """The learner's policy weights into the acting policy, as a policy worker reads each new version."""
        with torch.no_grad():
            for dst, src in self.published:
                dst.copy_(src)

    def _between_steps(self) -> None:
        """The runner's loop, between two steps: stop rules, error rate, records, checkpoints and evaluations."""
        cfg, t = self.cfg, self.totals
        now = time.monotonic()
        frames = t.env_steps * self.spec.frameskip
        if now - self.last_check >= CHECK_EVERY_S:
            self.last_check = now
            self.error_rate.check(t.env_steps, self.env_errors, now, self.last_env_error)
        if now - self.last_report >= cfg.report_interval and not cfg.deterministic:
            self._report(now)
        if now - self.last_ckpt >= cfg.checkpoint_interval:
            self._save()
            self.last_ckpt = now
        self.evaluation.tick(frames)
        if self.evaluation.enabled and int(self.evaluation.request["due"][DUE]) > self.eval_done:
            self._evaluate(int(self.evaluation.request["due"][DUE]))
        if cfg.frames and frames >= cfg.frames and self.stop_reason is None:
            self.stop_reason = "frames"
        elif cfg.seconds and now - self.t_loop >= cfg.seconds and self.stop_reason is None:
            self.stop_reason = "seconds"

    # ----- records, checkpoints, evaluations -----
    def _counters(self) -> dict[str, int]:
        return {"worker_restarts": 0, "policy_restarts": 0, "env_errors": self.env_errors}

    def _report(self, now: float) -> None:
        """A metrics record (the runner's fields), the progress line and the monitor's alerts."""
        t = self.totals
        record = interval_record(t, self.spec, time.time() - self.t_start, max(now - self.last_report, 1e-6),
                                 t.env_steps - self.interval_steps)
        record.update(self._counters())
        record.update(self.monitor.observe(record, t.learner, {}, None))  # no queues, no children
        t.learner = []
        info = {"frames": record["frames"], "env_steps": t.env_steps, "policy_version": t.policy_version,
                "episode_return_mean": record["episode_return_mean"]}
        for env in self.envs:
            if env.wants_training_info:  # curriculum envs
                env.set_training_info(info)
        record.update(self.evaluation.pop_results())
        self.metrics.write(record, step=record["frames"])
        self._notify("metrics", record)
        for video in self.evaluation.pop_videos():
            self.metrics.write_video("eval_video", video["gif"], video["video"], step=record["frames"])
        self.metrics_records += 1
        self.last_report, self.interval_steps = now, t.env_steps
        done = bool(self.cfg.frames) and record["frames"] >= self.cfg.frames
        if self.cfg.deterministic and now - self.last_printed < self.cfg.report_interval and not done:
            self.monitor.flush(verdict=False)
            return
        self.last_printed = now
        self.out(self.progress.line(record, now - self.t_loop), flush=True)
        self.monitor.flush(verdict=False)  # the bottleneck verdict's remedies speak of processes: recorded only

    def _save(self, final: bool = False) -> dict | None:
        """A checkpoint as the learner process writes it; its "saved" record, or None when nothing was written. A
        callback that raises stops the run (at the `final` one, the run ends with its error after the save)."""
        cfg, learner = self.cfg, self.learner
        run = run_state(self.totals, time.time() - self.t_start, self._counters())
        try:
            path = save_learner(cfg, learner, [src for _, src in self.published], self.totals.env_steps, run)
        except OSError as exc:  # full disk, unwritable dir: training goes on, the older checkpoints stay
            self.save_failed = save_failed_message(cfg, exc)
            self.out(f"asyncrl: warning: {self.save_failed}; training goes on, the previous checkpoints are kept",
                     flush=True)
            return None
        if path is None:
            self.out(f"asyncrl: {NOT_FINITE_SAVE}", flush=True)
            return None
        self.save_failed = None
        self.last_saved = {"version": learner.version, "env_steps": self.totals.env_steps, "path": path}
        try:
            self._notify("checkpoint", dict(self.last_saved))
        except RunError as exc:
            if not final:
                raise
            self.late_error = self.late_error or exc
        return self.last_saved

    def _evaluate(self, due: int) -> None:
        """An evaluation of the acting policy, played here (`runtime/roles/evaluator.py`'s episodes)."""
        self.eval_done = due
        reason = self.stop_reason
        result, self.best = evaluate(self.cfg, self.spec, self.policy, self.learner.version, due, self.best,
                                     lambda: self.stop_reason == reason, lambda msg: self.out(f"asyncrl: {msg}"))
        if result is not None:
            self.evaluation.receive(result)
            self._notify("eval", {k: result[k] for k in RESULT_KEYS if k in result})
        self.policy_mark = self.rollout_mark = self.last_update = time.monotonic()  # no stage's time

    def _final_evaluation(self) -> None:
        """--eval-every: the final weights, once --frames, --seconds or a callback stopped the run (as the runner
        does)."""
        if not self.evaluation.enabled or self.stop_reason not in FINAL_EVAL_REASONS:
            return
        frames = self.totals.env_steps * self.spec.frameskip
        self.evaluation.request_final(frames)
        self.out("final evaluation...", flush=True)
        self._evaluate(frames)

    def _notify(self, event: str, record: dict) -> None:
        """The user's callbacks; one returning False stops the run as a signal would."""
        if self.callbacks and not self.callbacks(event, record) and self.stop_reason is None:
            self.stop_reason = "callback"

    def _fatal(self, message: str, exit_code: int = 1, code: str = "env_broken") -> NoReturn:
        """Stop the run with an error: a last record saying why (the runner's fatal record), then RunError."""
        t = self.totals
        record = self.monitor.fatal_record({"message": message, "code": code}, t.env_steps * self.spec.frameskip,
                                           t.env_steps, time.time() - self.t_start)
        self.metrics.write(record, step=record["frames"])
        raise RunError(f"{message}; stopping." if code == "env_broken" else message, exit_code=exit_code)


def _episode(e: EpisodeStats) -> tuple:
    """A finished episode as a rollout worker reports it."""
    return (e.ret, e.length, e.truncated) if e.extra is None else (e.ret, e.length, e.truncated, e.extra)


__all__ = ["SerialRun"]
