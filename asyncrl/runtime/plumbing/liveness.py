"""Shared state that lets the runner find dead or stuck processes and recover from them.

One small anonymous shared block (inherited by every child, like the trajectory buffer):

- `beat_learner[0]`, `beat_policy[i]`, `beat_rollout[w]`, `beat_eval[0]`: `time.monotonic()` of the process's last loop
  iteration (0 until its first). CLOCK_MONOTONIC is system-wide, so the runner can compare them to its own.
- `slot_owner[slot]`: the rollout worker holding a trajectory slot, -1 when none does (free, full or with the
  learner). The runner hands a dead worker's slots back to the free queue.
- `want[slot]` / `acted[slot]`: the action handshake. A rollout worker sets `want[slot] = t` before asking
  for step t's actions; a policy worker serves a request only while `want[slot]` still equals its t, and sets
  `acted[slot] = t` once the actions are written; a rollout worker steps only when `acted[slot]` equals its
  t. So a request that is repeated (re-sent after a policy worker died) or stale (from a dead rollout worker)
  is answered at most harmlessly, and a stale wake-up is ignored. The learner clears `acted` of the slots it takes
  for an update, so `acted[slot] >= 0` also marks a slot begun and not yet trained (`lag_gate.py`).
- `transit[w]`: what rollout worker w is handing over: `TAKING` while it takes a slot off the free queue and
  records it as its own, the slot's index from clearing its ownership until it is on the full queue,
  `NO_TRANSIT` otherwise. A worker that dies with a transit may have lost that slot.
- `incarnation[w]`: bumped by the runner each time rollout worker w is restarted (new env seeds).
- `policy_epoch[0]`: bumped each time a policy worker is restarted; rollout workers then re-send the requests
  that were not answered, since the dead worker may have taken them off the queue.
- `env_errors[w]`: env exceptions rollout worker w absorbed (all its incarnations); row `workers`: the remote
  actor groups' (`--remote-workers`, counted by the Ray bridge).
- `beat_remote[0]`: the Ray bridge's heartbeat; it records the slots it reserves for remote groups in `slot_owner`
  and its hand-overs in `transit` under the index `workers`, as a rollout worker does under its own.
- `stepped[w]`: agent steps rollout worker w has taken in this session (all its incarnations; row `workers`: the
  remote groups'), and
  `step_budget[0]`: the agent steps after which the session's --frames are reached (0: no budget; under torchrun
  this rank's share of them), written by the runner once the learner is ready. The worker that sees the sum reach
  the budget reports at once, so the run stops within a step of its --frames instead of up to a report interval (a
  second) later.
- `last_words[w]`: why rollout worker w gave up (UTF-8, NUL-padded), written just before it exits.
- `busy[0]`: bumped about once a second by a process doing a long, legitimate step before its loop (compiling
  the learner's update or the policy's act, `busy_beating`), which also beats its heartbeat meanwhile: the
  supervisor counts the run as moving while it grows, so a cold compile of minutes is neither a hang nor a stall.
- `training_info`: the run's progress for curriculum envs (`set_training_info`), written by the runner with
  each metrics record: [sequence, frames, env steps, policy version, mean return (NaN before the first
  episode)]. The sequence is odd while the runner writes and even once it is done (`read_training_info`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from asyncrl.shm import SharedArrays

NO_OWNER = -1
NO_TRANSIT, TAKING = -1, -2
WORDS = 256


def liveness_layout(workers: int, policy_workers: int, slots: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    f64, i64 = np.dtype(np.float64), np.dtype(np.int64)
    return {
        "beat_learner": ((1,), f64),
        "beat_policy": ((policy_workers,), f64),
        "beat_rollout": ((workers,), f64),
        "beat_eval": ((1,), f64),  # the evaluation process (--eval-every)
        "beat_remote": ((1,), f64),  # the Ray bridge (--remote-workers)
        "slot_owner": ((slots,), i64),
        "want": ((slots,), i64),
        "acted": ((slots,), i64),
        "transit": ((workers + 1,), i64),  # the last row: the Ray bridge's
        "incarnation": ((workers,), i64),
        "policy_epoch": ((1,), i64),
        "env_errors": ((workers + 1,), i64),  # the last row: the Ray bridge's remote groups
        "stepped": ((workers + 1,), i64),
        "step_budget": ((1,), i64),
        "last_words": ((workers, WORDS), np.dtype(np.uint8)),
        "training_info": ((5,), f64),
        "busy": ((1,), i64),
    }


def allocate_liveness(workers: int, policy_workers: int, slots: int) -> SharedArrays:
    live = SharedArrays(liveness_layout(workers, policy_workers, slots))
    for name in ("slot_owner", "want", "acted"):
        live[name][:] = NO_OWNER
    live["transit"][:] = NO_TRANSIT
    return live


def write_training_info(live: SharedArrays, frames: int, env_steps: int, version: int,
                        return_mean: float | None) -> None:
    block = live["training_info"]
    block[0] += 1  # odd: being written
    block[1:] = (frames, env_steps, version, np.nan if return_mean is None else return_mean)
    block[0] += 1


def read_training_info(live: SharedArrays, seen: float) -> tuple[float, dict | None]:
    """(sequence, progress dict) when the runner wrote a new record since sequence `seen`, else (seen, None)."""
    block = live["training_info"]
    sequence = float(block[0])
    if sequence == seen or sequence % 2:
        return seen, None
    frames, steps, version, ret = block[1:].tolist()
    if float(block[0]) != sequence:  # rewritten while read: take it next time
        return seen, None
    return sequence, {"frames": int(frames), "env_steps": int(steps), "policy_version": int(version),
                      "episode_return_mean": None if np.isnan(ret) else ret}


def write_words(live: SharedArrays, worker: int, message: str) -> None:
    data = message.encode()[: WORDS - 1]
    row = live["last_words"][worker]
    row[:] = 0
    row[: len(data)] = np.frombuffer(data, dtype=np.uint8)


def read_words(live: SharedArrays, worker: int) -> str:
    """What rollout worker `worker` last wrote (then cleared), '' if nothing."""
    row = live["last_words"][worker]
    message = bytes(row).rstrip(b"\0").decode(errors="replace")
    row[:] = 0
    return message


def release_slots(live: SharedArrays, worker: int) -> tuple[list[int], bool]:
    """Forget every slot dead rollout worker `worker` held; return them, for the free queue, and whether it
    died handing a slot over (that slot, unrecorded, may be lost)."""
    held = np.flatnonzero(live["slot_owner"] == worker)
    transit = int(live["transit"][worker])
    maybe_lost = transit == TAKING or (transit >= 0 and transit not in held)
    for name in ("slot_owner", "want", "acted"):
        live[name][held] = NO_OWNER
    if transit >= 0:  # a slot lost on its way to the learner must not stay begun (the learner's lag gate waits on it)
        live["acted"][transit] = NO_OWNER
    live["transit"][worker] = NO_TRANSIT
    return held.tolist(), maybe_lost


@contextmanager
def busy_beating(live: SharedArrays, beat: str, index: int, every_s: float = 1.0) -> Iterator[None]:
    """While the body runs (a compile that can take minutes): from a thread, every `every_s` seconds, beat
    `live[beat][index]` and bump `live["busy"][0]`, so the supervisor sees a live process and a moving run."""
    done = threading.Event()

    def beat_loop() -> None:
        while not done.wait(every_s):
            live[beat][index] = time.monotonic()
            live["busy"][0] += 1

    thread = threading.Thread(target=beat_loop, name="asyncrl-busy-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
