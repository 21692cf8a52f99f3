"""Shared helpers: run `asyncrl-train` in a subprocess, read its metrics, snapshot /dev/shm."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from asyncrl.diagnostics.metrics import read_metrics as read_run_metrics
from tests import launcher

SHM = Path("/dev/shm")


def run_cli(args: list[str], train_dir: Path, timeout: float = 180.0,
            fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `asyncrl-train ARGS --train-dir TRAIN_DIR` to completion and capture its output: a fork of the warm
    interpreter (`tests/launcher.py`), or with `fresh` the installed script in a new interpreter (for runs that
    must not share the warm interpreter's hash seed and library state, e.g. two runs compared for an exact
    repeat)."""
    return launcher.run("train", [*args, "--train-dir", str(train_dir)], timeout=timeout, fresh=fresh)


@dataclass
class TrainRun:
    """A running `asyncrl-train` whose stdout and stderr go to files (a pipe nobody reads could block it)."""

    proc: launcher.Launched | subprocess.Popen[bytes]
    run_dir: Path
    stdout_path: Path
    stderr_path: Path
    started: float  # time.monotonic() just before the process was started

    @property
    def pid(self) -> int:
        return self.proc.pid

    def records(self) -> list[dict[str, Any]]:
        return read_metrics(self.run_dir)

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def ctrl_c(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to every process in the run's process group (if still running)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:  # exited in between
                pass

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


def start_train(args: list[str], train_dir: Path, experiment: str = "run", fresh: bool = False) -> TrainRun:
    """Start `asyncrl-train ARGS` in its own session (so Ctrl-C can go to its whole process group), a fork of the
    warm interpreter (`tests/launcher.py`), or with `fresh` the installed script (a run whose start-up time or
    memory the test reports)."""
    train_dir.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix=f"logs-{experiment}-", dir=train_dir.parent))
    out, err = logs / "stdout.txt", logs / "stderr.txt"
    started = time.monotonic()
    argv = [*args, "--train-dir", str(train_dir), "--experiment", experiment]
    proc = launcher.popen("train", argv, out, err, start_new_session=True, fresh=fresh)
    return TrainRun(proc, train_dir / experiment, out, err, started)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl records, skipping a last line that is still being written."""
    return read_run_metrics(str(run_dir))


def wait_for(predicate: Callable[[], Any], timeout: float, proc: subprocess.Popen[bytes] | None = None,
             interval: float = 0.2) -> Any:
    """Poll until predicate() is truthy (returned) or timeout; None if it never was or proc exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            return predicate() or None
        time.sleep(interval)
    return None


# What this project can put in /dev/shm: faster-fifo's multiprocessing arenas (`pym-<pid>-*`, unlinked at once
# unless the creator is killed in between; see runtime/store/run_dir.py clean_stale_shm) and anything named
# asyncrl.
# Other programs' files (and other test runs' short-lived arenas on a shared machine) are not ours to judge.
_PROJECT_SHM = re.compile(r"^pym-(\d+)-|asyncrl")


def shm_entries(pids: set[int] | None = None) -> set[str]:
    """This project's entries in /dev/shm; with `pids`, only the arenas those processes created."""
    names = set(os.listdir(SHM)) if SHM.is_dir() else set()
    ours = set()
    for name in names:
        match = _PROJECT_SHM.search(name)
        if match and (pids is None or match.group(1) is None or int(match.group(1)) in pids):
            ours.add(name)
    return ours


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """Torch in the test process runs on one thread: the suite's processes already share the cores, and a second
    thread only spins waiting for one (in-process learner tests took 3.4x the CPU on two threads on a busy
    machine). The runs a test starts set their own threads."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def shm_guard() -> Iterator[set[str]]:
    """Fails the test if this process or its children leave project entries in /dev/shm."""
    before = shm_entries()
    yield before
    mine = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    leaked = {name for name in shm_entries() - before
              if not (m := _PROJECT_SHM.search(name)) or m.group(1) is None or int(m.group(1)) in mine
              or not psutil.pid_exists(int(m.group(1)))}
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"


@pytest.fixture
def reap() -> Iterator[list[TrainRun]]:
    """Runs a test started; any still going at teardown are killed (their process group, by the runner's pid)."""
    runs: list[TrainRun] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            run.proc.wait(timeout=10)


def serve_request(channels: Any, traj: Any, deadline: float,
                  write: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """Act as the policy worker for one rollout-worker request: action 0 (and `write(slot, t)` for anything else
    the test's policy writes), then the hand-back; returns the request's (slot, t). A request the slot no longer
    wants (`want[slot] != t`) is skipped, as the policy worker skips it."""
    from asyncrl.runtime.plumbing.channels import Empty

    while time.monotonic() < deadline:
        try:
            worker, split, slot, t = channels.requests.get(timeout=0.05)
        except Empty:
            continue
        if channels.live["want"][slot] != t:
            continue
        traj["actions"][slot, t] = 0
        if write is not None:
            write(slot, t)
        channels.live["acted"][slot] = t
        channels.actions_ready[worker].put(split)
        return slot, t
    raise AssertionError("no request from the rollout worker in time")


def collect_rollout_slots(cfg: Any, order: list[int]) -> tuple[dict[str, Any], list[dict]]:
    """Run the real rollout worker (worker 0, one split) on `cfg`'s env, serving every request with action 0, for
    the slots `order` one after another; (a copy of the slot arrays, the worker's rollout reports)."""
    import multiprocessing as mp

    import numpy as np

    from asyncrl.envs.registry import make_env_spec
    from asyncrl.runtime.plumbing.channels import Channels, Empty
    from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots
    from asyncrl.runtime.roles.rollout_worker import run_rollout_worker

    cfg.validate()
    traj = allocate_trajectories(cfg, make_env_spec(cfg))
    channels = Channels.create(cfg.workers, num_slots(cfg))
    channels.free.put(order[0])
    proc = mp.get_context("fork").Process(target=run_rollout_worker, args=(0, cfg, traj, channels), daemon=True)
    proc.start()
    reports: list[dict] = []
    try:
        deadline = time.monotonic() + 60
        for i, slot in enumerate(order):
            for t in range(cfg.rollout):
                assert serve_request(channels, traj, deadline) == (slot, t)
            assert channels.full.get(timeout=30) == slot
            if i + 1 < len(order):
                channels.free.put(order[i + 1])
        arrays = {k: np.array(traj[k]) for k in traj}
    finally:
        channels.request_stop()  # the worker, waiting for a free slot, reports the steps since its last report
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    while True:
        try:
            kind, _, _, payload = channels.reports.get(timeout=0.2)
        except Empty:
            break
        if kind == "rollout":
            reports.append(payload)
    return arrays, reports


# The longest test files first (measured: the sums of their tests' durations on 2 cores, 2026-12-04). `make test`
# runs pytest-xdist with --dist loadfile --no-loadscope-reorder, which hands each worker the next file in collection
# order as it frees up, so starting the long ones early keeps one worker from running a 100 s file alone at the end.
SLOW_FIRST = ("test_doc_recipes_standalone.py", "test_doc_recipes.py", "test_remote_actors.py", "test_sweep_search.py",
              "test_distributed.py", "test_diagnostics_e2e.py",
              "test_reliability.py", "test_api.py", "test_examples.py", "test_e2e.py", "test_engine_paths.py",
              "test_memory.py", "test_gymnax_env.py", "test_off_policy_checkpoints.py", "test_recurrent.py",
              "test_population.py", "test_starvation.py", "test_serial.py", "test_seeding.py", "test_bench.py",
              "test_eval.py", "test_tune.py", "test_env_hooks.py", "test_group_signals.py", "test_sweep.py",
              "test_doc_commands.py", "test_env_recovery.py", "test_multi_agent.py", "test_off_policy_learners.py",
              "test_dict_obs.py", "test_action_masks.py", "test_diagnose_inside.py", "test_callbacks.py",
              "test_resume_config.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: the rest keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n logical` (make test) and `-n auto`: one test process more than the cores this process may use (its CPU
    affinity, capped by a cgroup quota: `asyncrl.system.usable_cpus`), where xdist would count every core of the
    machine. The tests wait on processes starting, sockets and report intervals: on 2 cores, one process a core
    left 7-8% of the CPU idle and pytest took 303-312 s (four runs, 2026-12-05); three processes left 2% idle and
    took 289-293 s (two runs). `make test` caps the count at TEST_JOBS; PYTEST_XDIST_AUTO_NUM_WORKERS still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    from asyncrl.system import usable_cpus

    return usable_cpus() + 1
