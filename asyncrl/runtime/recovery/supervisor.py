"""Supervision, in the runner: what happens when a process dies, hangs, or the machine misbehaves.

- A dead rollout worker (killed, crashed, or given up on its envs) is restarted with fresh envs; the slots
  it held go back to the free queue (their partial trajectories are discarded) and its actions queue is
  drained. A dead policy worker is restarted and the rollout workers re-send what it may have taken.
- A process whose heartbeat (`asyncrl.runtime.plumbing.liveness`) is older than `--hang-timeout` is
  named, killed and handled as dead; one that never beat gets `STARTUP_GRACE_S`. Time it spent runnable
  but waiting for a core is not counted (`asyncrl.runtime.recovery.starvation`): starved is not hung.
  The whole run also stops if neither env steps nor policy versions move for `STALL_FACTOR` hang timeouts (at
  least `STARTUP_GRACE_S` before the first move), its processes' time waiting for a core again not counted.
- More than `MAX_RESTARTS` restarts of one process within `RESTART_WINDOW_S`, a dead or hung learner, or env
  instances raising in more than `--max-env-error-rate` of the env steps over `ENV_ERROR_WINDOW_S`: the run
  stops with one line naming the cause (the runner adds which checkpoint remains).
- A thread repairs queue locks that a killed process left held (`asyncrl.runtime.recovery.queue_repair`).

This module never imports torch.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import Config
from asyncrl.runtime.plumbing.channels import Channels, drain
from asyncrl.runtime.plumbing.liveness import read_words, release_slots
from asyncrl.runtime.plumbing.run_error import RunError, checkpoint_hint
from asyncrl.runtime.plumbing.trajectories import circulating_slots, num_slots
from asyncrl.runtime.recovery.queue_repair import QueueRepair, RepairThread
from asyncrl.runtime.recovery.rollout_guard import EXIT_ENV_ERRORS
from asyncrl.runtime.recovery.starvation import QUIET_AFTER_S, StarvationWatch, stale, starved, waits_on_a_futex

RESTART_WINDOW_S = 300.0
MAX_RESTARTS = 5  # restarts of one process within the window; one more failure stops the run
STARTUP_GRACE_S = 120.0  # a process that has not beaten yet (importing torch, loading ROMs) gets this long
STALL_FACTOR = 2.0
CHECK_EVERY_S = 0.25
ENV_ERROR_PRINT_EVERY_S = 10.0
ENV_ERROR_WINDOW_S = 60.0  # the env error rate is judged over this much of the recent past
ENV_ERROR_MIN = 10  # errors in the window before a rate can stop the run (a few early errors are not a rate)


@dataclass
class Member:
    """One supervised process slot (its current process lives in the runner's `procs`)."""

    name: str
    kind: str  # learner, policy or rollout
    index: int
    started: float = 0.0
    restarts: deque = field(default_factory=deque)
    cause: str | None = None  # set when the supervisor kills it
    starvation: StarvationWatch = field(default_factory=StarvationWatch)
    starved_note: float = 0.0  # the heartbeat whose overdue age was last excused as starvation (noted once)
    stall_watch: StarvationWatch = field(default_factory=StarvationWatch)  # its waits since the run last moved
    # the other members' waits since this one's heartbeat went quiet half a limit ago (by their names)
    peer_watches: dict[str, StarvationWatch] = field(default_factory=dict)


def parse_name(name: str) -> tuple[str, int]:
    kind, _, index = name.partition("-")
    return kind, int(index or 0)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped responding"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_ENV_ERRORS:
        return "gave up on its envs"
    if code == 0:
        return "exited unexpectedly"
    return f"crashed (exit code {code}; its traceback is above)"


class EnvErrorRate:
    """--max-env-error-rate over the last `ENV_ERROR_WINDOW_S`: env instances raising in more of the env steps
    stop the run (the runner's supervisor, and the serial loop)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.window: deque[tuple[float, int, int]] = deque()  # (time, env steps, env errors)

    def check(self, env_steps: int, errors: int, now: float, last: dict | None = None) -> None:
        """RunError above the rate; `last` is the newest env_error report (its worker, message, where)."""
        window = self.window
        window.append((now, env_steps, errors))
        while now - window[0][0] > ENV_ERROR_WINDOW_S:
            window.popleft()
        t0, steps0, errors0 = window[0]
        new_errors, new_steps = errors - errors0, env_steps - steps0
        if new_errors < ENV_ERROR_MIN or new_errors <= self.cfg.max_env_error_rate * new_steps:
            return
        last = last or {}
        raise RunError(
            f"env {self.cfg.env} raised in {new_errors:,} of {new_steps:,} env steps over the last {now - t0:.0f} s "
            f"({new_errors / max(new_steps, 1):.1%}, above --max-env-error-rate {self.cfg.max_env_error_rate:g}); "
            f"the last: rollout-{last.get('worker', '?')}: {last.get('message', '?')} in {last.get('where', '?')}; "
            f"stopping.")


class Supervisor:
    def __init__(self, cfg: Config, channels: Channels, procs: dict[str, Any], respawn: Callable[[str], None],
                 out: Callable[..., None] = print, checkpoint_hint: Callable[[dict | None], str] | None = None):
        """`checkpoint_hint`: says which checkpoint remains in place of `Supervisor.checkpoint_hint` (a torchrun
        rank > 0 keeps none and points at rank 0's)."""
        self.cfg, self.channels, self.procs, self.respawn, self.out = cfg, channels, procs, respawn, out
        self._hint = checkpoint_hint
        self.live = channels.live
        self.members: dict[str, Member] = {}
        self.worker_restarts = self.policy_restarts = self.env_errors_base = 0
        self.spare_slots = list(range(circulating_slots(cfg), num_slots(cfg)))  # for slots lost in transit
        self.save_failed: str | None = None
        self.last_saved: dict | None = None  # the learner's latest "saved" report: version, env_steps, path
        self.last_env_error: dict | None = None
        self._error_rate = EnvErrorRate(cfg)
        self._last_check = 0.0
        self._progress: tuple[object, float] = (None, time.monotonic())
        self._progress_moved = False  # the run has moved since its first check (its processes have started)
        self._stall_note = 0.0  # the stall whose age was last excused as starvation (noted once)
        self._env_error_printed: dict[int, float] = {}
        self._repair_lines: deque[str] = deque()
        self._repair: RepairThread | None = None

    # ----- lifecycle -----
    def start_repair(self) -> None:
        why = QueueRepair.supported()
        if why:
            self.out(f"asyncrl: note: {why}; a process killed inside a queue operation could stall the run")
            return
        self._repair = RepairThread(QueueRepair(self.channels.named_queues()), self._repair_lines.append)
        self._repair.start()

    def stop_repair(self) -> None:
        if self._repair is not None:
            self._repair.stop()
            self._repair = None

    def spawned(self, name: str) -> None:
        """The runner (re)started process `name`: its startup grace begins now."""
        member = self.members.get(name)
        if member is None:
            member = self.members[name] = Member(name, *parse_name(name))
            member.starvation.quiet_after_s = min(QUIET_AFTER_S, self.cfg.hang_timeout / 8)
        member.started = time.monotonic()
        self._beats(member.kind)[member.index] = 0.0

    # ----- checks (runner loop) -----
    def check(self, progress: object = None, env_errors: tuple[int, int] | None = None) -> None:
        """Restart dead or hung workers; raise RunError when the run cannot go on.

        `progress` changes whenever the run moves; `env_errors` is (env steps, env errors) as reported together.
        """
        now = time.monotonic()
        if now - self._last_check < CHECK_EVERY_S:
            return
        self._last_check = now
        while self._repair_lines:
            self.out(f"asyncrl: {self._repair_lines.popleft()}")
        for name, proc in list(self.procs.items()):
            if not proc.is_alive():
                self._died(name, proc)
        for name in list(self.procs):
            self._check_heartbeat(name, now)
        if progress is not None:
            self._check_progress(progress, now)
        if env_errors is not None:
            self._check_env_error_rate(*env_errors, now)

    def check_learner(self) -> None:
        """At a stop: a learner that has already died is the run's error, even when a signal (e.g. torchrun's
        SIGTERM after another rank noticed the death first) ended the loop before the periodic check saw it."""
        proc = self.procs.get("learner")
        if proc is not None and not proc.is_alive():
            self._died("learner", proc)

    def _beats(self, kind: str):
        return self.live[f"beat_{kind}"]

    def _check_heartbeat(self, name: str, now: float) -> None:
        member, proc = self.members[name], self.procs[name]
        beat = float(self._beats(member.kind)[member.index])
        since, limit = (beat, self.cfg.hang_timeout) if beat else (
            member.started, max(STARTUP_GRACE_S, self.cfg.hang_timeout))
        age = now - since
        waited = member.starvation.waited_s(proc.pid, since, age) if proc.pid else 0.0
        asleep_on_lock = bool(proc.pid) and age > limit / 2 and waits_on_a_futex(proc.pid)
        peers = self._peer_waits(member, since, age) if asleep_on_lock else 0.0
        if age <= limit or not proc.is_alive():
            return
        if not stale(age, waited, limit):
            if member.starved_note != since and starved(waited, age - member.starvation.quiet_after_s):
                member.starved_note = since
                self.out(f"asyncrl: note: {name} has not reported for {age:.0f} s, {waited:.0f} s of it waiting for "
                         f"a CPU core (the machine is overloaded); starved, not hung: waiting longer")
            return
        if asleep_on_lock and not stale(age, peers, limit):
            if member.starved_note != since:
                member.starved_note = since
                self.out(f"asyncrl: note: {name} has not reported for {age:.0f} s, asleep on a lock while another "
                         f"process of the run waited {peers:.0f} s for a CPU core (the machine is overloaded); "
                         f"starved through it, not hung: waiting longer")
            return
        member.cause = f"made no progress for {age:.0f} s{'' if beat else ' after starting'}" + (
            f" ({waited:.0f} s of it waiting for a CPU core)" if waited >= 1 else "")
        proc.kill()
        proc.join(timeout=5)
        self._died(name, proc)

    def _peer_waits(self, member: Member, since: float, age: float) -> float:
        """The longest wait for a core of any other process of the run since `member`'s heartbeat went quiet, watched
        from the first look on (the caller looks only past half a limit, at a member asleep on a lock, so a healthy
        run reads no one's counters and the first half's waits are not excused)."""
        longest = 0.0
        for other in self.members.values():
            proc = self.procs.get(other.name)
            if other is member or proc is None or not proc.pid:
                continue
            watch = member.peer_watches.setdefault(other.name, StarvationWatch(quiet_after_s=0.0))
            longest = max(longest, watch.waited_s(proc.pid, since, age))
        return longest

    def _check_progress(self, progress: object, now: float) -> None:
        """RunError when the run has not moved for `STALL_FACTOR` hang timeouts (before its first move: at least
        `STARTUP_GRACE_S`, as its processes get), less the time its processes spent waiting for a core: on an
        overloaded machine a run whose workers are starved (at their lower priority) is slow, not stalled."""
        value, since = self._progress
        if progress != value:
            self._progress_moved = self._progress_moved or value is not None
            self._progress = (progress, now)
            return
        limit = STALL_FACTOR * self.cfg.hang_timeout
        if not self._progress_moved:
            limit = max(limit, STARTUP_GRACE_S)
        age = now - since
        if age <= limit / 2:  # the run-queue watch starts half way: the first half's waits are not excused
            return
        waited = max((m.stall_watch.waited_s(self.procs[m.name].pid, since, age) for m in self.members.values()
                      if m.name in self.procs and self.procs[m.name].pid), default=0.0)
        if age <= limit:
            return
        if not stale(age, waited, limit):
            if self._stall_note != since and starved(waited, age - limit / 2):
                self._stall_note = since
                self.out(f"asyncrl: note: no env steps and no learner updates for {age:.0f} s, {waited:.0f} s of "
                         f"it waiting for a CPU core (the machine is overloaded); starved, not stalled: waiting longer")
            return
        waits = f" ({waited:.0f} s of it waiting for a CPU core)" if waited >= 1 else ""
        raise RunError(f"no env steps and no learner updates for {age:.0f} s{waits} although every process "
                       f"is alive; stopping.")

    def _check_env_error_rate(self, env_steps: int, errors: int, now: float) -> None:
        self._error_rate.check(env_steps, errors, now, self.last_env_error)

    def _died(self, name: str, proc: Any) -> None:
        member = self.members[name]
        proc.join(timeout=1)
        cause = member.cause or describe_exit(proc.exitcode)
        words = read_words(self.live, member.index) if member.kind == "rollout" else ""
        if words:
            cause += f" ({words})"
        member.cause = None
        if member.kind == "learner":
            raise RunError(f"the learner {cause}; stopping.")
        now = time.monotonic()
        member.restarts.append(now)
        while now - member.restarts[0] > RESTART_WINDOW_S:
            member.restarts.popleft()
        if len(member.restarts) > MAX_RESTARTS:
            raise RunError(f"{name} failed {len(member.restarts)} times in {RESTART_WINDOW_S / 60:.0f} min (last: "
                           f"it {cause}); stopping.")
        if member.kind == "rollout":
            slots, maybe_lost = release_slots(self.live, member.index)
            drain(self.channels.actions_ready[member.index])
            spare = self.spare_slots.pop() if maybe_lost and self.spare_slots else None
            back = slots + ([] if spare is None else [spare])
            if back:
                self.channels.give_back(back)
            self.live["incarnation"][member.index] += 1
            self.worker_restarts += 1
            what = f"restarted it with fresh envs ({len(slots)} unfinished trajectories discarded"
            what += ")" if spare is None else "; it died handing a slot over, so a spare slot stands in for it)"
        elif member.kind == "eval":
            what = "restarted it (training was not affected)"
        elif member.kind == "remote":  # the bridge's slots are recorded under the index after the workers'
            slots, maybe_lost = release_slots(self.live, self.cfg.workers)
            spare = self.spare_slots.pop() if maybe_lost and self.spare_slots else None
            back = slots + ([] if spare is None else [spare])
            if back:
                self.channels.give_back(back)
            what = f"restarted it (its remote actor groups start afresh; {len(slots)} reserved slots freed" + (
                ")" if spare is None else "; it died queueing a slot, so a spare slot stands in for it)")
        else:
            self.policy_restarts += 1
            what = "restarted it (the rollout workers re-send what it had taken)"
        self.respawn(name)
        if member.kind == "policy":
            self.live["policy_epoch"][0] += 1
        self.out(f"asyncrl: {name} {cause}; {what} [{len(member.restarts)} of {MAX_RESTARTS} restarts allowed "
                 f"in {RESTART_WINDOW_S / 60:.0f} min]", flush=True)

    def checkpoint_hint(self, final: dict | None = None) -> str:
        """Which checkpoint remains; `final`: the learner's "saved" report of its save at this stop, if any."""
        if self._hint is not None:
            return self._hint(final)
        return checkpoint_hint(self.cfg.run_dir, final)

    # ----- reports -----
    def handle(self, kind: str, payload: dict) -> None:
        """Reports about faults: env errors, a worker giving up, checkpoint saves."""
        if kind == "env_error":
            self.last_env_error = payload
            worker, now = int(payload.get("worker", -1)), time.monotonic()
            if now - self._env_error_printed.get(worker, -1e9) >= ENV_ERROR_PRINT_EVERY_S:
                self._env_error_printed[worker] = now
                who = payload.get("name", f"rollout-{worker}")
                self.out(f"asyncrl: {who}: env raised {payload['message']} in {payload['where']}; "
                         f"{payload.get('action', 'reset it')} ({payload['count']} env errors in this worker; the run "
                         f"stops above --max-env-error-rate {self.cfg.max_env_error_rate:g})", flush=True)
        elif kind == "saved":
            self.save_failed = None
            self.last_saved = payload
        elif kind == "save_failed":
            self.save_failed = payload["message"]
            self.out(f"asyncrl: warning: {payload['message']}; training goes on, the previous checkpoints are kept",
                     flush=True)

    # ----- counters (metrics.jsonl, checkpoints) -----
    def counters(self) -> dict[str, int]:
        return {"worker_restarts": self.worker_restarts, "policy_restarts": self.policy_restarts,
                "env_errors": self.env_errors_base + int(self.live["env_errors"].sum())}

    def restore(self, run: dict) -> None:
        """Continue the counters of a resumed run."""
        self.worker_restarts += int(run.get("worker_restarts", 0))
        self.policy_restarts += int(run.get("policy_restarts", 0))
        self.env_errors_base += int(run.get("env_errors", 0))
