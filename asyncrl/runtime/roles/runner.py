"""Runner: the main process. Allocates shared memory (`wiring.py`), forks the workers, supervises them, aggregates their
reports into metrics, schedules checkpoints and shuts everything down in order.

Rollout workers are forked first, from a torch-free runner, which keeps them small and fast to start. The runner
then imports torch once for the learner, policy workers and evaluator forked next, which share that import
copy-on-write instead of each paying its seconds of CPU. The runner itself never runs a torch operation, so the
forks stay safe (`launch.check_can_fork`).
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing as mp
import time
from collections.abc import Iterable

from asyncrl.config import Config, ConfigError
from asyncrl.diagnostics.aggregate import PolicyTotals
from asyncrl.diagnostics.metrics import MetricsWriter
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.wandb_logger import open_sinks
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.registry import state_layout
from asyncrl.population.pbt import PopulationTrainer
from asyncrl.runtime.distributed.rank import DataParallel
from asyncrl.runtime.plumbing.callbacks import Callback
from asyncrl.runtime.plumbing.channels import Empty
from asyncrl.runtime.plumbing.eval_schedule import FINAL_EVAL_REASONS, FINAL_TIMEOUT_S
from asyncrl.runtime.plumbing.liveness import write_training_info
from asyncrl.runtime.plumbing.run_error import RunError
from asyncrl.runtime.plumbing.trajectories import trajectory_bytes
from asyncrl.runtime.plumbing.wiring import build_wiring
from asyncrl.runtime.recovery.starvation import StarvationWatch, stale
from asyncrl.runtime.recovery.supervisor import Supervisor
from asyncrl.runtime.remote.tally import RemoteTally
from asyncrl.runtime.roles.process import ignore_group_signals, mark_parent
from asyncrl.runtime.stages.runbook import RunBook, restore_totals, run_state
from asyncrl.runtime.store.run_dir import prepare_run_dir
from asyncrl.system import available_memory

SHUTDOWN_TIMEOUT_S = 8.0
READY_TIMEOUT_S = 300.0  # the learner reports ready within this long (a compile in progress extends it)


def _child_main(module: str, function: str, *args) -> None:
    """Fork target: import the component's module inside the child (so torch never loads in the runner)."""
    ignore_group_signals()  # before the (slow) import: a group-wide SIGTERM must not kill a starting child
    getattr(importlib.import_module(module), function)(*args)


def join_while_beating(proc: mp.process.BaseProcess, beat, deadline: float, hang_timeout: float) -> bool:
    """Join `proc` until `deadline` (time.monotonic()), then for as long as its heartbeat `beat[0]` (the monotonic
    time of its last sign of work) is younger than `hang_timeout`: the learner's final checkpoint waits for an
    update of a big batch that outlasts SHUTDOWN_TIMEOUT_S. Time it spent waiting for a core is not counted
    against it, as the supervisor does not. True once it has exited."""
    proc.join(timeout=max(0.0, deadline - time.monotonic()))
    watch = StarvationWatch(quiet_after_s=0.0)
    while proc.is_alive():
        last = float(beat[0])
        age = time.monotonic() - last
        if stale(age, watch.waited_s(proc.pid, last, age), hang_timeout):
            break
        proc.join(timeout=0.5)
    return not proc.is_alive()


def _import_torch_once() -> None:
    """Import torch here so the torch children forked next share it (imports nothing when already imported)."""
    import torch  # noqa: F401


__all__ = ["RunError", "Runner", "check_memory", "join_while_beating", "prepare_run_dir"]


def check_memory(cfg: Config, spec: EnvSpec) -> None:
    need = trajectory_bytes(cfg, spec, state_layout(cfg))  # with the recurrent state columns (--rnn)
    available = available_memory()  # free RAM, or less under a container's memory limit
    if need > 0.8 * available:
        raise ConfigError(f"the trajectory buffers need {need / 2**30:.1f} GiB but only {available / 2**30:.1f} "
                          f"GiB of RAM is free; lower --workers, --envs-per-worker, --rollout or --batch-size")


class Runner:
    """The forked engine's transport: the stages in their processes, their reports into the run book."""

    def __init__(self, cfg: Config, out=print, callbacks: Iterable[Callback] = (),
                 ranks: DataParallel | None = None, spec: EnvSpec | None = None):
        """`spec`: the env's, as the preflight made it (`asyncrl.preflight.Prepared.spec`); made here if None."""
        self.cfg = cfg
        self.ranks = ranks  # under torchrun: this rank's place and state (asyncrl.runtime.distributed)
        self.out = out
        self.spec = spec if spec is not None else make_env_spec(cfg)
        self.book = RunBook(cfg, self.spec, out, callbacks, RunMonitor(cfg, self.spec, out))
        self.totals = self.book.totals
        self.saved_before_stop: dict | None = None  # the learner's last "saved" report when a RunError struck
        self.procs: dict[str, mp.Process] = {}
        self._spawn_args: dict[str, tuple] = {}
        self.pbt: PopulationTrainer | None = None  # --pbt: the population's exploit/explore schedule
        self.policy_settings: list[dict[str, float]] = []  # --num-policies > 1: each policy's current settings
        self.remote = RemoteTally(cfg.remote_workers)  # --remote-workers: the Ray bridge's reports

    # ----- lifecycle -----
    def run(self) -> int:
        cfg, spec, book = self.cfg, self.spec, self.book
        prepare_run_dir(cfg, spec, self.out)
        self.wiring = build_wiring(cfg, spec, self.ranks)
        self.traj, self.weights, self.channels = self.wiring.traj, self.wiring.weights, self.wiring.channels
        ranks = self.ranks
        hint = ranks.checkpoint_hint if ranks is not None and ranks.follower else None  # rank 0's checkpoints
        self.supervisor = Supervisor(cfg, self.channels, self.procs, self._respawn, self.out, checkpoint_hint=hint)
        book.open(ranks.metrics_writer(cfg.run_dir, lambda: open_sinks(cfg)) if ranks is not None  # torchrun
                  else MetricsWriter(cfg.run_dir, open_sinks(cfg)))  # SIGHUP as SIGTERM, threads' errors in one line
        book.t_start = self.t_launch = time.time()
        code, write_error = 1, ""
        run_error: RunError | None = None
        try:
            self.supervisor.start_repair()
            self._start_processes()
            self._wait_ready()
            self._loop()
            self.supervisor.check_learner()  # RunError if the learner died before the stop
            code = 0
        except RunError as exc:
            run_error = exc
            self.saved_before_stop = self.supervisor.last_saved
        except OSError as exc:  # the train dir filled up or went away under metrics.jsonl
            write_error = book.ending(exc)[1]
        finally:
            self._shutdown()
            self.supervisor.stop_repair()
            if run_error is None and book.late_callback_error is not None:
                run_error, code = book.late_callback_error, 1
            book.close()
            self.wiring.close()
        return self._exit(code, run_error, write_error)

    def _exit(self, code: int, run_error: RunError | None, write_error: str) -> int:
        """Say how the run ended, after the shutdown (in which the learner saves a final checkpoint)."""
        supervisor = self.supervisor
        if run_error is not None:
            final = supervisor.last_saved
            final = final if final is not self.saved_before_stop else None
            hint = supervisor.checkpoint_hint(final) if run_error.hint else ""
            return self.book.conclude(run_error.exit_code, str(run_error), hint, None, None)
        save_failed = supervisor.save_failed if code == 0 else None
        return self.book.conclude(code, write_error, supervisor.checkpoint_hint(), save_failed, supervisor.last_saved)

    def _spawn(self, name: str, module: str, function: str, *args) -> None:
        ctx = mp.get_context("fork")
        proc = ctx.Process(target=_child_main, args=(module, function, *args), name=name, daemon=True)
        self._spawn_args[name] = (module, function, *args)
        self.supervisor.spawned(name)
        mark_parent()
        gc.freeze()  # the child's collector leaves the inherited objects alone, so their pages stay shared
        try:
            proc.start()
        finally:
            gc.unfreeze()
        self.procs[name] = proc

    def _respawn(self, name: str) -> None:
        """Start a fresh process in a dead one's place (called by the supervisor)."""
        self._spawn(name, *self._spawn_args[name])

    def _run_state(self) -> dict:
        """Counters a checkpoint keeps, so a resumed run's metrics continue (time included)."""
        return run_state(self.totals, time.time() - self.book.t_start, self.supervisor.counters())

    def _start_processes(self) -> None:
        # Torch-free rollout workers first, then one torch import for the children that need it.
        for proc in sorted(self.wiring.processes, key=lambda p: not p.name.startswith("rollout-")):
            if not proc.name.startswith("rollout-"):
                _import_torch_once()
            self._spawn(proc.name, proc.module, proc.function, *proc.args)
        if self.book.evaluation.enabled:  # its request block belongs to the run book's evaluation schedule
            self._spawn("eval-0", "asyncrl.runtime.roles.evaluator", "run_evaluator",
                        self.cfg, self.spec, self.weights[0], self.channels, self.book.evaluation.request)

    def _wait_ready(self) -> None:
        """Until the learner reports ready: at most READY_TIMEOUT_S, counted again each time a process busy with a
        compile (`busy_beating`) shows it is still at it."""
        busy = self.channels.live["busy"]
        seen, deadline = int(busy[0]), time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.book.stop_reason is None:
            self.supervisor.check()  # restarts dead workers; RunError if the run cannot go on
            if int(busy[0]) != seen:
                seen, deadline = int(busy[0]), time.monotonic() + READY_TIMEOUT_S
            try:
                kind, _, _, payload = self.channels.reports.get(timeout=0.1)
            except Empty:
                continue
            if kind == "ready":
                self.totals.env_steps += payload["env_steps"]
                self.totals.policy_version = payload["version"]
                self.totals.expect_learner_stats(payload.get("stats", ()))
                run = payload.get("run") or {}
                self.book.t_start -= float(run.get("elapsed", 0.0))
                restore_totals(self.totals, run)
                self.supervisor.restore(run)
                self._start_population(payload.get("policies") or [])
                self._publish_step_budget()
                return
            self._handle(kind, payload)
        if self.book.stop_reason is None:
            raise RunError(f"the learner did not start within {READY_TIMEOUT_S:.0f} s")

    def _publish_step_budget(self) -> None:
        """The agent steps left to --frames, for the rollout workers to report at once when they are taken (in
        lockstep every rollout is reported anyway). Under torchrun the group stops on the sum of the ranks' steps,
        so each rank's workers report at once at its share of them: with the whole budget, a rank whose workers'
        once-a-second reports lagged its fast updates could reach --frames alone before the group agreed."""
        if self.cfg.frames and not self.cfg.deterministic:
            left = -(-self.cfg.frames // self.spec.frameskip) - self.totals.env_steps
            world = self.ranks.info.world_size if self.ranks is not None else 1
            self.channels.live["step_budget"][0] = max(1, -(-left // world))

    def _start_population(self, settings: list[dict[str, float]]) -> None:
        """--num-policies > 1: per-policy totals, and with --pbt the exploit/explore schedule."""
        self.policy_settings = settings
        if len(settings) < 2 and not self.cfg.self_play:
            return
        self.totals.policies = [PolicyTotals(self_play=self.cfg.self_play) for _ in settings]
        if self.cfg.pbt:
            self.pbt = PopulationTrainer(self.cfg, settings, self.book.frames, self.channels.learner_cmds.put)
            self.policy_settings = self.pbt.settings  # what each policy trains with now, in every record

    def _loop(self) -> None:
        cfg, book = self.cfg, self.book
        start_steps = self.totals.env_steps
        book.start_loop()
        first_frames = False
        while book.stop_reason is None:
            self._drain_reports()
            if not first_frames and self.totals.env_steps > start_steps:
                first_frames = True
                self.out(f"first frames {time.time() - self.t_launch:.1f} s after start", flush=True)
            self.supervisor.check(progress=(self.totals.env_steps, self.totals.policy_version,
                                            int(self.channels.live["busy"][0])),
                                  env_errors=(self.totals.env_steps, self.totals.env_errors))
            now = time.monotonic()
            if book.report_due(now):
                self._report(now)
            if book.checkpoint_due(now):
                self.channels.learner_cmds.put(("save", self.totals.env_steps, self._run_state()))
            book.evaluation.tick(book.frames)
            if self.pbt is not None:
                self.pbt.tick(book.frames, self.totals.policies)
            book.check_stop(now, frames=not cfg.deterministic)  # in lockstep, --frames is checked after each update
            if self.ranks is not None:  # torchrun: the group's agreed stop
                book.stop_reason = self.ranks.group_stop(book.stop_reason, self.totals)
            if book.stop_reason is None:
                self._wait_for_reports(0.05)
        self._stop_sampling()
        self._final_evaluation()
        # A last record for the tail of the run (its rates cover the tail only). Under torchrun the group's final
        # agreement may come after this rank's last steps: its record is due too.
        self._drain_reports()
        if book.tail_due(force=self.ranks is not None):
            self._report(time.monotonic())
        self.out(f"stopping ({book.stop_reason}) after {self.totals.env_steps - start_steps:,} env steps")

    def _stops_sampling_first(self) -> bool:
        """Whether a stop ends sampling before the final record (`_stop_sampling`) and, at --frames, the learner
        trains on the batches collected: not in lockstep, not under torchrun (whose ranks agree on each update)."""
        return not self.cfg.deterministic and self.ranks is None

    def _stop_sampling(self) -> None:
        """Stop the rollout workers at once and wait for them (each reports its last steps as it leaves), so the
        final record counts every step taken, and the learner's last batches (a --frames stop) are no more than
        that. In lockstep every step is counted already; under torchrun the group's stop is agreed first."""
        if not self._stops_sampling_first():
            return
        self.channels.request_stop()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        for name, proc in self.procs.items():
            if name.startswith(("rollout-", "remote-")):
                proc.join(timeout=max(0.0, deadline - time.monotonic()))

    def _lockstep_update(self) -> None:
        """--deterministic: one record per update, written when its report arrives. The rollout worker reported
        the batch's steps and episodes before handing it over, and collects the next one only after this report
        was sent, so every record covers exactly the same data in every run with the same seed."""
        if self.book.stop_reason is not None:
            return
        self._report(time.monotonic())
        self.book.check_stop(time.monotonic())

    def _final_evaluation(self) -> None:
        """--eval-every: evaluate the final weights once the samplers have stopped, so the last record has it (and
        best.pt weighs them), after a stop by --frames, --seconds or a callback; not after a signal."""
        book = self.book
        reason = book.stop_reason
        if not book.evaluation.enabled or book.stop_reason not in FINAL_EVAL_REASONS:
            return
        self.channels.request_stop()  # rollout and policy workers leave; the learner waits for its stop command
        self._restart_evaluator(nice=0)
        book.request_final_evaluation()
        deadline = time.monotonic() + FINAL_TIMEOUT_S
        while (not book.evaluation.final_done and book.stop_reason == reason and time.monotonic() < deadline
               and self.procs["eval-0"].is_alive()):
            self._drain_reports()
            time.sleep(0.05)

    def _restart_evaluator(self, nice: int) -> None:
        """Replace the evaluator with one at `nice`. The periodic one runs at nice 19 so that it takes only idle
        CPU; the final evaluation, with the samplers stopped, must not starve when other programs keep the
        cores busy (measured: 49 s instead of 3 s with two busy loops), and a process cannot raise its own
        priority. The old one leaves at the stop flag (an evaluation it was playing is superseded)."""
        old = self.procs["eval-0"]
        old.join(timeout=5.0)
        if old.is_alive():
            old.kill()
            old.join()
        module, function, *args = self._spawn_args["eval-0"]
        self._spawn("eval-0", module, function, *args[:5], nice)

    def _shutdown(self) -> None:
        self.book.shutting_down = True
        ch = self.channels
        ch.request_stop()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        # At a --frames stop the learner first trains on the whole batches already collected (the rollout workers
        # have left: `_stop_sampling`).
        drain = self.book.stop_reason == "frames" and self._stops_sampling_first()
        learner = self.procs.get("learner")
        if learner is not None and learner.is_alive():
            ch.learner_cmds.put(("stop", self.totals.env_steps, self._run_state(), drain))
        saved_before = self.supervisor.last_saved
        for name, proc in self.procs.items():
            if name != "learner":
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        busy = learner is not None and not join_while_beating(learner, self.channels.live["beat_learner"], deadline,
                                                              self.cfg.hang_timeout)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        # The final save's report; a later fatal report (e.g. every rollout worker's envs broke) adds nothing.
        self._drain_reports(skip_fatal=True)
        if busy and self.supervisor.last_saved is saved_before and self.supervisor.save_failed is None:
            # killed before it could save its final checkpoint: never a silent exit 0
            self.supervisor.save_failed = (f"the learner was still in its update {self.cfg.hang_timeout:g} s after "
                                           f"its last heartbeat and was killed")

    # ----- statistics -----
    def _wait_for_reports(self, timeout: float) -> None:
        """Sleep until reports arrive (handled at once: a --frames budget is seen as soon as it is reported) or
        `timeout` s pass."""
        try:
            messages = self.channels.reports.get_many(timeout=timeout, max_messages_to_get=1000)
        except Empty:
            return
        for kind, _, _, payload in messages:
            self._handle(kind, payload)

    def _drain_reports(self, skip_fatal: bool = False) -> None:
        while True:
            try:
                messages = self.channels.reports.get_many(block=False, max_messages_to_get=1000)
            except Empty:
                return
            for kind, _, _, payload in messages:
                if not (skip_fatal and kind == "fatal"):
                    self._handle(kind, payload)

    def _handle(self, kind: str, payload: dict) -> None:
        t, book = self.totals, self.book
        if kind == "rollout":
            t.add_rollout(payload)
            book.monitor.sample_queues(self.channels)
        elif kind == "remote":  # the remote groups' steps and episodes count as any; their times are their own
            t.add_rollout({"env_steps": payload["env_steps"], "env_errors": payload.get("env_errors", 0),
                           "episodes": payload["episodes"], "episode_policies": payload.get("episode_policies", ())})
            self.remote.add(payload)
        elif kind == "policy":
            t.add_policy(payload)
        elif kind == "learner":
            t.add_learner(payload)
            if self.cfg.deterministic:
                self._lockstep_update()
        elif kind == "fatal":
            book.fatal(payload)
            raise RunError(payload["message"], hint=payload.get("hint", True), exit_code=payload.get("exit_code", 1))
        elif kind in ("warning", "info"):
            self.out(f"asyncrl: {payload['message']}")
        elif kind == "eval":
            if book.evaluation.pending:  # an earlier evaluation not yet in a record: its own record first
                self._report(time.monotonic())
            book.receive_eval(payload)
        elif kind in ("env_error", "saved", "save_failed"):
            self.supervisor.handle(kind, payload)
            if kind == "saved":
                book.notify("checkpoint", {k: payload[k] for k in ("path", "version", "env_steps")})

    def _report(self, now: float) -> None:
        extra = {f"policy_{p}/{k}": v for p, settings in enumerate(self.policy_settings) for k, v in settings.items()
                 } if len(self.policy_settings) > 1 else {}
        book, live = self.book, self.channels.live
        extra.update(self.remote.record(max(now - book.last_report, 1e-6), self.totals.env_steps - book.interval_steps))
        book.report(now, self.supervisor.counters(),
                    lambda record: book.monitor.observe(record, self.totals.learner, self.procs, self.channels),
                    lambda info: write_training_info(live, info["frames"], info["env_steps"], info["policy_version"],
                                                     info["episode_return_mean"]),  # for curriculum envs
                    extra=extra, show=self.ranks is None or not self.ranks.follower)  # a follower's warns only
