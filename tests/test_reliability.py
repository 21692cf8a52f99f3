"""Faults, with real processes: killed and hung workers, env exceptions, a dead or failing learner, a killed
runner, corrupt checkpoints, a full disk, and bad input that only the env can reveal (a resume that does not
fit the run's checkpoints: tests/test_resume_config.py).

Runs use `python -m tests.faults` (asyncrl-train, optionally with a planted learner fault) and the
fault-injecting envs in tests/faults.py. Workers are found among the runner's own children by process title.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from faster_fifo import Empty, Queue

from asyncrl.runtime.recovery.queue_repair import QueueRepair, RepairThread
from asyncrl.runtime.store.checkpoint import list_checkpoints
from asyncrl.runtime.store.run_dir import clean_stale_shm
from tests import launcher

REPO = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")
SMALL = ["--workers", "2", "--envs-per-worker", "4", "--rollout", "16", "--batch-size", "64", "--minibatches", "1",
         "--report-interval", "1"]
CARTPOLE = ["--env", "CartPole-v1", *SMALL]


@dataclass
class Run:
    """One `asyncrl-train` in its own session; stdout and stderr go to files."""

    proc: launcher.Launched
    run_dir: Path
    out_path: Path
    err_path: Path
    pids: set[int] = field(default_factory=set)  # every process of the run seen so far

    def stdout(self) -> str:
        return self.out_path.read_text()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def output(self) -> str:
        return self.stdout() + self.stderr()

    def records(self) -> list[dict[str, Any]]:
        import json

        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def children(self) -> dict[str, psutil.Process]:
        """The runner's descendants by process title (asyncrl-learner, asyncrl-rollout-0, ...)."""
        found = {}
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return found
        for child in descendants:
            try:
                found[child.cmdline()[0]] = child
            except (psutil.Error, IndexError):
                continue
            self.pids.add(child.pid)
        return found

    def kill_child(self, title: str) -> int:
        child = wait_until(lambda: self.children().get(title), 60, self)
        assert child is not None, f"no {title} among the runner's children\n{self.output()[-3000:]}"
        os.kill(child.pid, signal.SIGKILL)
        return child.pid

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"asyncrl-train still running after {timeout:.0f} s\n{self.output()[-3000:]}")


def wait_until(predicate: Callable[[], Any], timeout: float, run: Run | None = None) -> Any:
    """Poll predicate until truthy (returned) or timeout/the run exits (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            return predicate() or None
        time.sleep(0.2)
    return None


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Start runs under tmp_path; at teardown any still going are killed, and none may leave a process or a
    /dev/shm entry behind."""
    started: list[Run] = []
    shm_before = set(os.listdir(SHM)) if SHM.is_dir() else set()
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()

    def start(args: list[str], experiment: str = "run", fault: str = "") -> Run:
        logs = tmp_path / f"logs-{experiment}-{len(started)}"
        logs.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
               "ASYNCRL_FAULT_DIR": str(fault_dir), "ASYNCRL_FAULT": fault}
        argv = [*args, "--train-dir", str(tmp_path / "train"), "--experiment", experiment]
        proc = launcher.popen("tests.faults", argv, logs / "out", logs / "err", cwd=REPO, env=env,
                              start_new_session=True)
        run = Run(proc, tmp_path / "train" / experiment, logs / "out", logs / "err", {proc.pid})
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=10)
    for run in started:
        left = [pid for pid in run.pids if _running(pid)]
        assert not left, f"processes left behind: {left}"
        new = (set(os.listdir(SHM)) if SHM.is_dir() else set()) - shm_before
        ours = [name for name in new if any(f"-{pid}-" in name or f"_{pid}_" in name for pid in run.pids)]
        assert not ours, f"left in /dev/shm: {ours}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def last(run: Run) -> dict[str, Any]:
    records = run.records()
    assert records, f"no metrics\n{run.output()[-3000:]}"
    return records[-1]


def assert_no_traceback(run: Run) -> None:
    assert "Traceback" not in run.output(), run.output()[-3000:]


# ----- workers -----
def test_killed_workers_and_env_errors_are_recovered(runs: Callable[..., Run]) -> None:
    """SIGKILL a rollout worker and a policy worker, with an env that raises now and then: the run goes on."""
    run = runs(["--env", "tests.faults:make_flaky_env", *SMALL, "--seconds", "120"])
    assert wait_until(lambda: run.records() and last(run)["frames"] > 0, 90, run), run.output()[-3000:]
    run.kill_child("asyncrl-rollout-0")
    assert wait_until(lambda: "rollout-0 was killed by SIGKILL; restarted it" in run.stdout(), 15, run), \
        run.output()[-3000:]
    frames = last(run)["frames"]
    assert wait_until(lambda: last(run)["frames"] > frames + 1000, 30, run), "no progress after the restart"
    run.kill_child("asyncrl-policy-0")
    assert wait_until(lambda: "policy-0 was killed by SIGKILL; restarted it" in run.stdout(), 15, run), \
        run.output()[-3000:]
    frames = last(run)["frames"]
    assert wait_until(lambda: last(run)["frames"] > frames + 1000, 30, run), \
        f"rollout workers hang after the policy worker's restart\n{run.output()[-3000:]}"
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(30) == 0, run.output()[-3000:]
    final = last(run)
    assert final["worker_restarts"] == 1 and final["policy_restarts"] == 1, final
    assert final["env_errors"] >= 2, final  # every env instance raises once, at its 300th step
    assert "env raised RuntimeError: planted env fault in step; replaced env" in run.stdout()
    assert_no_traceback(run)


def test_hung_worker_is_restarted_and_dead_learner_stops_the_run(runs: Callable[..., Run]) -> None:
    """An env that never returns is named and its worker restarted; a killed learner stops the run at once,
    pointing at the last checkpoint, and is named as the cause even when a SIGTERM follows at once."""
    run = runs(["--env", "tests.faults:make_hang_once_env", *SMALL, "--seconds", "120", "--hang-timeout", "4",
                "--checkpoint-interval", "2"])
    named = wait_until(lambda: "made no progress for" in run.stdout(), 90, run)
    assert named, run.output()[-3000:]
    assert "restarted it with fresh envs" in run.stdout()
    assert wait_until(lambda: list_checkpoints(str(run.run_dir)), 30, run)
    frames = last(run)["frames"]
    assert wait_until(lambda: last(run)["frames"] > frames + 1000, 30, run), "no progress after the restart"
    learner = run.kill_child("asyncrl-learner")
    deadline = time.monotonic() + 5
    while _running(learner) and time.monotonic() < deadline:  # dead, but not yet seen by the 0.25 s checks
        time.sleep(0.001)
    os.kill(run.proc.pid, signal.SIGTERM)  # as torchrun does when another rank noticed the death first
    t0 = time.monotonic()
    assert run.wait(20) == 1, run.output()[-3000:]
    assert time.monotonic() - t0 < 10
    err = run.stderr()
    assert "the learner was killed by SIGKILL; stopping" in err and "continue with --resume" in err, err
    assert os.path.basename(list_checkpoints(str(run.run_dir))[0]) in err
    assert last(run)["worker_restarts"] >= 1


def test_env_that_always_fails_stops_the_run_at_once(runs: Callable[..., Run]) -> None:
    """Fresh envs that fail before their first step: restarting the worker would only fail again."""
    run = runs(["--env", "tests.faults:make_broken_env", *SMALL, "--seconds", "120"])
    assert run.wait(120) == 1
    err = run.stderr()
    assert "failed before its first step" in err and "planted reset fault" in err, run.output()[-3000:]
    assert_no_traceback(run)


def test_learner_failure_stops_the_run_cleanly(runs: Callable[..., Run]) -> None:
    """A learner that raises and one that hangs each stop their run: exit 1, the cause named on stderr. The two
    runs go at once, so the hang's --hang-timeout wait overlaps the other run."""
    expected = {"learner_raise": "the learner crashed (exit code 1", "learner_hang": "the learner made no progress"}
    started = {fault: runs([*CARTPOLE, "--seconds", "120", "--hang-timeout", "5"], experiment=fault, fault=fault)
               for fault in expected}
    for fault, run in started.items():
        assert run.wait(120) == 1, (fault, run.output()[-3000:])
        err = run.stderr()
        assert expected[fault] in err and "stopping" in err, (fault, run.output()[-3000:])


# ----- the runner killed, checkpoints, resume, full disk, bad input -----
def test_runner_sigkill_then_resume_past_a_corrupt_checkpoint(runs: Callable[..., Run]) -> None:
    args = [*CARTPOLE, "--hidden-size", "256", "--checkpoint-interval", "1", "--keep-checkpoints", "3"]
    first = runs([*args, "--seconds", "120"])
    assert wait_until(lambda: len(list_checkpoints(str(first.run_dir))) >= 2, 90, first), first.output()[-3000:]
    children = list(first.children().values())
    assert {"asyncrl-learner", "asyncrl-policy-0", "asyncrl-rollout-0", "asyncrl-rollout-1"} <= set(first.children())
    assert all(not child.children() for child in children), "workers must not have children of their own"
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(5)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"children outlived the runner by 10 s: {alive}"

    # The newest checkpoint is truncated: --resume says so and falls back to the one before.
    newest, previous = list_checkpoints(str(first.run_dir))[:2]
    Path(newest).write_bytes(Path(newest).read_bytes()[:1000])
    import torch

    state = torch.load(previous, weights_only=False)
    n_first = len(first.records())
    second = runs([*args, "--resume", "--seconds", "60"])
    assert wait_until(lambda: second.records()[n_first:], 90, second), second.output()[-3000:]
    os.kill(second.proc.pid, signal.SIGTERM)
    assert second.wait(30) == 0, second.output()[-3000:]
    out = second.stdout()
    assert f"checkpoint {newest} is truncated or corrupt" in out and f"resumed from {previous}" in out, out[-3000:]
    assert Path(newest + ".corrupt").exists() and Path(newest + ".corrupt").stat().st_size == 1000
    if newest in list_checkpoints(str(first.run_dir)):  # the resumed run saved that version again: a whole file
        fresh = Path(newest).read_bytes()
        assert hashlib.sha256(fresh).hexdigest() == Path(newest + ".sha256").read_text().strip()
    resumed = second.records()[n_first]
    run_state = state["run"]
    assert resumed["frames"] >= state["env_steps"] and resumed["policy_version"] > state["learner"]["version"]
    assert resumed["time"] > run_state["elapsed"] and resumed["episodes"] >= run_state["episodes"], (resumed, run_state)
    assert list_checkpoints(str(first.run_dir))[0] != previous, "SIGTERM must leave a final checkpoint"
    assert_no_traceback(second)

    # A full disk (here: the learner may not write a file half a checkpoint's size): warnings, exit 1, and the
    # old checkpoints intact.
    kept = {p: Path(p).read_bytes() for p in list_checkpoints(str(first.run_dir))}
    limit = min(len(b) for b in kept.values()) // 2
    # 2 s (was 4): a periodic save fails about every second, and the final save's failure prints the same warning
    third = runs([*args, "--resume", "--seconds", "2"], fault=f"learner_fsize:{limit}")
    assert third.wait(120) == 1, third.output()[-3000:]
    assert "could not save a checkpoint" in third.stdout() and "the previous checkpoints are kept" in third.stdout()
    assert "the final checkpoint was not saved" in third.stderr(), third.output()[-3000:]
    assert_no_traceback(third)
    assert {p: Path(p).read_bytes() for p in list_checkpoints(str(first.run_dir))} == kept
    for path in kept:
        assert hashlib.sha256(kept[path]).hexdigest() == Path(path + ".sha256").read_text().strip()
    assert not list(Path(first.run_dir, "checkpoints").glob("*.tmp"))

    # The disk fills under TensorBoard's writer thread: the run's one-line error names the last good checkpoint,
    # and the thread prints no `Exception in thread` traceback of its own.
    fourth = runs([*args, "--resume", "--seconds", "30", "--report-interval", "1"], fault="tensorboard_enospc")
    assert fourth.wait(120) == 1, fourth.output()[-3000:]
    err = fourth.stderr()
    assert err.count("\n") == 1 and "(No space left on device); stopped." in err and "--resume" in err, err
    assert "Exception in thread" not in fourth.output(), fourth.output()[-3000:]
    assert_no_traceback(fourth)

    # That a resume with another model shape or env is refused before anything starts (one line, exit 2) is
    # tests/test_resume_config.py::test_resume_refuses_another_env_or_model_shape's proof (the same check).


def test_bad_input_is_one_line_exit_2(runs: Callable[..., Run]) -> None:
    huge = runs(["--env", "tests.faults:make_huge_obs_env", *SMALL, "--seconds", "4"])
    unsupported = runs(["--env", "custom_env:make_dict_obs_env", *SMALL, "--seconds", "4"])
    for run, fragment in ((huge, "the trajectory buffers need"), (unsupported, "key 'mode' is Discrete(3)")):
        assert run.wait(60) == 2, run.output()
        assert run.stderr().count("\n") == 1 and fragment in run.stderr(), run.stderr()
        assert_no_traceback(run)


# ----- pieces, in process -----
def _lock_and_die(queue: Queue) -> None:
    mutex = ctypes.addressof(queue.queue_obj_buffer) + 56
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(mutex))
    os.kill(os.getpid(), signal.SIGKILL)


def test_queue_repair_releases_a_lock_held_by_a_dead_process() -> None:
    assert QueueRepair.supported() is None
    queue = Queue(max_size_bytes=10_000)
    proc = mp.get_context("fork").Process(target=_lock_and_die, args=(queue,))
    proc.start()
    proc.join()
    repaired: list[str] = []
    thread = RepairThread(QueueRepair([("q", queue)]), repaired.append, interval=0.2)
    thread.start()
    try:
        # put() blocks on the dead process's lock until the repair releases it (forever without one, hence
        # the daemon thread).
        putter = threading.Thread(target=queue.put, args=(1,), daemon=True)
        putter.start()
        putter.join(timeout=5)
        assert not putter.is_alive(), "put() is still blocked on the dead process's lock"
        assert queue.get(timeout=1) == 1
        # The repair thread reports after releasing the lock: the put() may return before the report arrives.
        deadline = time.monotonic() + 5
        while not repaired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert repaired and f"dead thread {proc.pid}" in repaired[0]
    finally:
        thread.stop()


def _consume(queue: Queue) -> None:
    while True:
        try:
            queue.get(timeout=0.1)
        except Empty:
            pass


def _produce(queue: Queue) -> None:
    while True:
        queue.put(0, timeout=60)
        time.sleep(random.random() * 0.002)


def test_queue_survives_consumers_killed_while_waiting() -> None:
    """Without the repair, a consumer killed inside a wait soon leaves the producer stuck forever (glibc < 2.41)."""
    ctx = mp.get_context("fork")
    queue = Queue(max_size_bytes=64_000)
    thread = RepairThread(QueueRepair([("q", queue)]), lambda line: None, interval=0.2)
    thread.start()
    producer = ctx.Process(target=_produce, args=(queue,), daemon=True)
    consumers = [ctx.Process(target=_consume, args=(queue,), daemon=True) for _ in range(3)]
    for p in [producer, *consumers]:
        p.start()
    try:
        for _ in range(150):
            time.sleep(random.random() * 0.04)
            i = random.randrange(len(consumers))
            consumers[i].kill()
            consumers[i].join()
            consumers[i] = ctx.Process(target=_consume, args=(queue,), daemon=True)
            consumers[i].start()
        producer.kill()
        producer.join()
        assert wait_until(lambda: queue.qsize() == 0, 10), "the consumers are stuck on the queue"
    finally:
        thread.stop()
        for p in [producer, *consumers]:
            p.kill()
            p.join()


def test_stale_dev_shm_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = mp.get_context("fork").Process(target=lambda: None)
    dead.start()
    dead.join()
    (tmp_path / f"pym-{dead.pid}-abc").write_bytes(b"x")
    (tmp_path / f"pym-{os.getpid()}-abc").write_bytes(b"x")  # a live process's: kept
    (tmp_path / "other").write_bytes(b"x")
    assert clean_stale_shm(str(tmp_path)) == [f"pym-{dead.pid}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"pym-{os.getpid()}-abc", "other"])


def test_learner_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    """Weights, optimizer, normalizer, LR schedule position, version and RNG states come back exactly."""
    import numpy as np
    import torch

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.agents.batch import Batch
    from asyncrl.config import Config
    from asyncrl.envs.registry import make_env_spec
    from asyncrl.runtime.store.checkpoint import load_latest_checkpoint, save_checkpoint

    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path), normalize_obs=True, lr_schedule="linear",
                 frames=10_000, minibatches=1)
    spec = make_env_spec(cfg.env)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    t, b = 8, 4
    batch = Batch(obs=torch.randn(t + 1, b, 4), actions=torch.randint(0, 2, (t, b)),
                  behaviour_logp=torch.full((t, b), -0.69), rewards=torch.ones(t, b),
                  terminated=torch.zeros(t, b, dtype=torch.bool), truncated=torch.zeros(t, b, dtype=torch.bool),
                  final_obs=torch.zeros(b, 4), final_step=torch.full((b,), -1), lag=torch.zeros(t, b, dtype=torch.long))
    learner.train(batch, frames=0)
    learner.samples_trained = 5_000
    save_checkpoint(cfg.run_dir, learner.version, {"learner": learner.state_dict()}, keep=2)
    expected_rng = (torch.get_rng_state(), np.random.get_state()[1].copy())
    torch.manual_seed(123)
    np.random.seed(123)
    restored = APPOLearner(cfg, spec, torch.device("cpu"))
    restored.load_state_dict(load_latest_checkpoint(cfg.run_dir)[1]["learner"])
    for (name, a), b_ in zip(learner.model.state_dict().items(), restored.model.state_dict().values()):
        assert torch.equal(a, b_), name
    assert restored.optimizer.state_dict()["state"][0]["step"] == learner.optimizer.state_dict()["state"][0]["step"]
    assert restored.version == learner.version and restored.samples_trained == 5_000
    assert restored.learning_rate(restored.samples_trained) == learner.learning_rate(learner.samples_trained) < cfg.lr
    assert torch.equal(torch.get_rng_state(), expected_rng[0])
    assert (np.random.get_state()[1] == expected_rng[1]).all()
