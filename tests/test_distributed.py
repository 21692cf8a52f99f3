"""Data-parallel learners under torchrun, with real processes: 2 gloo ranks on this machine, launched as one
node (`--nproc-per-node 2`) and as two nodes (two torchrun commands meeting at a c10d rendezvous).

The averaging itself is proved exactly on two gloo ranks of real learners on hand-made batches (the averaged
gradients are the mean of the ranks' own, bit for bit); the torchrun runs are short and check that the group
runs, stays identical, stops together, resumes and fails cleanly. Each is bounded by env steps (tiny CartPole
settings) with generous wall-clock timeouts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from asyncrl.config import Config, ConfigError
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.runtime.distributed.group import CHECKSUMS_ENV, CHECKSUMS_FILE
from asyncrl.runtime.distributed.rank import rank_device, rank_from_environ
from asyncrl.runtime.store.checkpoint import list_checkpoints
from tests import launcher

FLAGS = ["--env", "CartPole-v1", "--env-vectorization", "loop", "--device", "cpu", "--workers", "1",
         "--envs-per-worker", "4", "--report-interval", "1"]
UPDATE_STEPS = 2 * 256  # two ranks x the vector preset's batch
SHORT_FRAMES = 6 * UPDATE_STEPS  # about 6 updates of the group
TIMEOUT_S = 150.0
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """One torchrun command (its own session, so the test can always clean up after it): `python -m
    torch.distributed.run` as a fork of the tests' warm interpreter (tests/launcher.py); its ranks are new
    interpreters, as torchrun starts them."""

    def __init__(self, torchrun_args: list[str], train_args: list[str], train_dir: Path, name: str,
                 module: str = "asyncrl.train"):
        self.out = train_dir.parent / f"{name}.out"
        env = {**os.environ, CHECKSUMS_ENV: "1"}
        # torchrun's own log directory in the test's (its default is a new directory under /tmp, never removed)
        args = [*torchrun_args, "--log-dir", str(train_dir.parent / f"{name}.torchrun"), "-m", module, *FLAGS,
                *train_args, "--train-dir", str(train_dir)]
        self.proc = launcher.popen("torch.distributed.run", args, self.out, self.out, env=env,
                                   start_new_session=True)

    def wait(self, timeout: float = TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun did not finish within {timeout:.0f} s\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def launches():
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.kill()


def single_node(port: int, train_args: list[str], train_dir: Path, name: str = "node") -> Launch:
    return Launch(["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)],
                  train_args, train_dir, name)


def checksums(run_dir: Path, skip: int = 0) -> dict[int, str]:
    """Version -> parameter checksum after that update, from the learner's debug file (minus `skip` lines)."""
    lines = (run_dir / CHECKSUMS_FILE).read_text().splitlines()[skip:]
    return {r["version"]: r["sha256"] for r in map(json.loads, lines)}


def group_processes(port: int) -> list[psutil.Process]:
    """The live runners of a launch: they carry its MASTER_PORT in their environment (their children too, but
    setting a process title overwrites what /proc shows of it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MASTER_PORT") == str(port) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_ranks_agree(run_dir: Path, min_updates: int = 20) -> dict[int, str]:
    rank0, rank1 = checksums(run_dir), checksums(run_dir / "rank1")
    common = sorted(set(rank0) & set(rank1))
    assert len(common) >= min_updates, f"only {len(common)} updates on both ranks"
    assert set(rank0) == set(rank1), "the ranks did a different number of updates"
    different = [v for v in common if rank0[v] != rank1[v]]
    assert not different, f"parameters differ between the ranks after updates {different}"
    return rank0


def test_rank_from_environ() -> None:
    base = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
            "MASTER_PORT": "1"}
    info = rank_from_environ(base)
    assert (info.rank, info.world_size, info.local_rank, info.master) == (1, 4, 1, "h:1")
    assert rank_from_environ({**base, "WORLD_SIZE": "1", "RANK": "0"}) is None  # one rank: a plain run
    assert rank_from_environ({k: v for k, v in base.items() if k != "MASTER_PORT"}) is None
    assert Config().dist_timeout > 0
    assert rank_device("cpu", 3) == "cpu"
    with pytest.raises(ConfigError, match="--device cuda"):
        rank_device("cuda:1", 0)  # under torchrun the local rank picks the GPU


def test_two_ranks_of_sac_keep_a_replay_buffer_each_and_stay_identical(tmp_path: Path, launches: list[Launch]) -> None:
    """Off-policy under torchrun: each rank inserts into and samples from its own buffer; the gradients of the
    critics, the actor and SAC's temperature (outside the model) are averaged, so the ranks stay identical."""
    train_dir = tmp_path / "train"
    launch = single_node(free_port(), ["--env", "Pendulum-v1", "--algo", "sac", "--learning-starts", "128",
                                       "--frames", "768", "--hidden-size", "32", "--sac-batch-size", "64"], train_dir)
    launches.append(launch)
    code = launch.wait()
    out = launch.output()
    assert code == 0, out[-3000:]
    run_dir = train_dir / "Pendulum-v1"
    assert_ranks_agree(run_dir, min_updates=4)
    trained = [r for r in read_metrics(str(run_dir)) if r.get("updates_total")]
    assert trained and trained[-1]["ranks"] == 2 and trained[-1]["utd_achieved"] == 1.0, trained[-1:]


def test_gradients_are_averaged_exactly_and_the_counters_agreed(tmp_path: Path) -> None:
    """Two gloo ranks, each a real APPO learner on its own batches (`tests/dist_rank_step.py`), through the
    learner's hooks: rank 1 starts from rank 0's weights, every optimizer step applies exactly the mean of the two
    ranks' gradients, the counters and the observation moments are pooled, and a non-finite loss on one rank makes
    both skip the step."""
    port = free_port()
    # each rank a fork of the tests' warm interpreter (tests/launcher.py), the output of both in files
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]
    procs = [launcher.popen(f"{launcher.SCRIPT}{ROOT / 'tests' / 'dist_rank_step.py'}", [rank, port, tmp_path],
                            log, log, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}) for rank, log in
             zip((0, 1), logs, strict=True)]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert codes == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)
    import torch

    r0, r1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in (0, 1))

    def same(a: list, b: list) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    assert not same(r0["before_join"], r1["before_join"])  # different seeds, different initial weights
    assert same(r1["after_join"], r0["before_join"]) and same(r0["after_join"], r0["before_join"])
    assert len(r0["steps"]) == len(r1["steps"]) == 4  # 2 epochs x 2 minibatches
    for (local0, synced0), (local1, synced1) in zip(r0["steps"], r1["steps"], strict=True):
        assert not same(local0, local1)  # each rank's own data
        mean = [(a + b) * 0.5 for a, b in zip(local0, local1, strict=True)]
        assert same(synced0, mean) and same(synced1, mean)  # bit for bit: the sum of two, halved
    assert same(r0["after_train"], r1["after_train"]) and not same(r0["after_train"], r0["after_join"])
    for r in (r0, r1):  # the runners' env steps and episodes and the trained samples summed, the rates averaged
        assert (r["group_env_steps"], r["group_episodes"], r["ranks"]) == (3500, 18, 2), r
        assert r["samples_trained"] == r0["local_trained"] + r1["local_trained"] > r["local_trained"]
        assert r["lr"] == pytest.approx(2e-3)
        # the observation moments pooled over both ranks' samples (the bootstrap rows excluded)
        assert r["obs_count"] == pytest.approx(r0["local_trained"] + r1["local_trained"], abs=1e-3)
    pooled = torch.cat([_rank_obs(0), _rank_obs(1)]).double().mean(0)
    assert torch.equal(r0["obs_mean"], r1["obs_mean"])
    torch.testing.assert_close(r0["obs_mean"], pooled, rtol=1e-6, atol=1e-6)
    # a NaN loss on rank 1 only: both ranks skipped every step of that batch
    assert r0["nonfinite_updates"] == r1["nonfinite_updates"] == 4
    assert same(r0["after_nan"], r0["after_train"]) and same(r1["after_nan"], r1["after_train"])


def _rank_obs(rank: int):
    from tests.dist_rank_step import make_batch

    return make_batch(seed=rank).obs[:-1].reshape(-1, 4)


def test_two_nodes_c10d_rendezvous_stay_identical_with_a_gru_on_dict_observations(tmp_path: Path,
                                                                                   launches: list[Launch]) -> None:
    """Two torchrun nodes on an image-plus-vector Dict env (a CNN and an MLP encoder, per-key slots) with a
    recurrent core (--rnn gru: state columns in the slots, the learner's re-run from stored states, the core's
    gradients averaged with the rest)."""
    train_dir = tmp_path / "train"
    port = free_port()
    nodes = []
    for node in (0, 1):
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"asyncrl-test-{port}"]
        # Rollouts of 16 steps (the 8-step episodes still end inside them) and batches of 64: the group's
        # 6 x 512 frames are 24 updates, as 12 x 512 were at 32 and 128; a rank's CNN and GRU work halves (a plain
        # run of 3,072 frames at 32/128 took 10.4 s of CPU, of 1,536 at 16/64 7.8 s, of 64 frames 4.0 s). Two epochs,
        # not the preset's 8: still several optimizer steps a batch, each re-running the GRU from the stored states;
        # the test took 11.1-11.5 s of CPU, against 14.0-14.5 s with 8 (2026-12-07).
        dict_env = ["--env", "tests.custom_env:SignMatch", "--rollout", "16", "--batch-size", "64", "--minibatches",
                    "2", "--epochs", "2", "--rnn", "gru", "--rnn-size", "16", "--experiment", "signmatch"]
        nodes.append(Launch(args, [*dict_env, "--frames", str(6 * UPDATE_STEPS)], train_dir, f"node{node}",
                            module="asyncrl.cli.train"))
    launches.extend(nodes)
    for launch in nodes:
        assert launch.wait() == 0, launch.output()[-3000:]
    assert_ranks_agree(train_dir / "signmatch")


@dataclass
class ShortRun:
    """One finished 2-rank CartPole run of SHORT_FRAMES, shared by the tests that read it (read-only)."""

    run_dir: Path
    code: int
    output: str


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShortRun]:
    train_dir = tmp_path_factory.mktemp("short") / "train"
    launch = single_node(free_port(), ["--frames", str(SHORT_FRAMES)], train_dir, "short")
    try:
        code = launch.wait()
        yield ShortRun(train_dir / "CartPole-v1", code, launch.output())
    finally:
        launch.kill()


def test_two_ranks_one_node_stay_identical_and_stop_together(short_run: ShortRun) -> None:
    """The group runs (every process, both learners in one gloo group), keeps identical parameters after every
    update, stops after the same update on an agreed --frames, and counts both ranks' env steps."""
    out, run_dir = short_run.output, short_run.run_dir
    assert short_run.code == 0, out[-3000:]
    assert_ranks_agree(run_dir, min_updates=4)
    assert "[rank 0] stopping (frames, agreed by all 2 ranks)" in out, out[-2000:]
    assert "[rank 1] stopping (frames, agreed by all 2 ranks)" in out, out[-2000:]
    assert "group: 2 workers, 8 envs, 512 samples per update" in out
    # the default rule: 2 ranks x the preset's 256 is twice its batch, so the rate is sqrt(2) x its 1e-3
    for rank in (0, 1):
        assert (f"[rank {rank}] scaling: 8 envs x 16 steps x 8 epochs = B_eff 1,024; global batch 512 (2 ranks x "
                f"256) = 2x the reference 256 -> lr 1e-3 x sqrt(2) = 1.4e-3 (--lr-scaling sqrt)") in out, out[-3000:]
    # progress lines (group frames, ETA) from rank 0 only
    progress = re.compile(r"^\[rank (\d)\] \[\s*\d+s\] frames ", re.MULTILINE)
    assert {m.group(1) for m in progress.finditer(out)} == {"0"}, out[-3000:]
    records = read_metrics(str(run_dir))
    assert records[-1]["ranks"] == 2 and records[-1]["env_steps"] >= SHORT_FRAMES
    assert not (run_dir / "rank1" / "metrics.jsonl").exists()  # rank 0 writes the group's metrics
    # The final checkpoint counts both ranks' env steps (the stop came when their sum reached --frames).
    import torch

    saved = torch.load(list_checkpoints(str(run_dir))[0], map_location="cpu", weights_only=False)["env_steps"]
    rank0_alone = int(re.search(r"\[rank 0\] stopping .* after ([\d,]+) env steps", out).group(1).replace(",", ""))
    assert saved >= SHORT_FRAMES > rank0_alone


def test_resume_continues_the_policy_version_on_both_ranks(short_run: ShortRun, tmp_path: Path,
                                                           launches: list[Launch]) -> None:
    assert short_run.code == 0, short_run.output[-3000:]
    train_dir = tmp_path / "train"
    run_dir = train_dir / "CartPole-v1"
    shutil.copytree(short_run.run_dir, run_dir)  # the shared run stays as it ended
    saved = max(checksums(run_dir))  # the version of the last update is the one checkpointed
    assert list_checkpoints(str(run_dir))[0].endswith(f"ckpt_{saved:010d}.pt")
    steps_before = read_metrics(str(run_dir))[-1]["env_steps"]
    lines_before = [len(checksums(d)) for d in (run_dir, run_dir / "rank1")]
    # The first run overshoots its budget by however many steps the workers make while the ranks agree to stop
    # (up to twice it on a slow machine), so the second budget counts from where the first ended.
    budget = steps_before + SHORT_FRAMES
    second = single_node(free_port(), ["--frames", str(budget), "--resume"], train_dir, "second")
    launches.append(second)
    assert second.wait() == 0, second.output()[-3000:]
    assert "resumed from" in second.output()
    rank0, rank1 = checksums(run_dir, lines_before[0]), checksums(run_dir / "rank1", lines_before[1])
    resumed = sorted(rank1)
    assert resumed[0] == saved + 1, f"rank 1 restarted at version {resumed[0]}, not {saved + 1}"
    assert sorted(rank0) == resumed and all(rank0[v] == rank1[v] for v in resumed)
    records = read_metrics(str(run_dir))
    assert records[-1]["env_steps"] > steps_before and records[-1]["policy_version"] > saved


def test_killed_learner_stops_the_group(tmp_path: Path, launches: list[Launch]) -> None:
    train_dir = tmp_path / "train"
    run_dir = train_dir / "CartPole-v1"
    port = free_port()
    launch = single_node(port, ["--seconds", "120", "--checkpoint-interval", "1"], train_dir)
    launches.append(launch)
    deadline = time.monotonic() + 90
    while not list_checkpoints(str(run_dir)) and time.monotonic() < deadline and launch.proc.poll() is None:
        time.sleep(0.5)
    assert list_checkpoints(str(run_dir)), launch.output()[-3000:]
    tree = [psutil.Process(launch.proc.pid), *psutil.Process(launch.proc.pid).children(recursive=True)]
    rank1 = [p for p in group_processes(port) if p.environ().get("RANK") == "1"]
    learners = [p for p in rank1[0].children() if p.cmdline()[:1] == ["asyncrl-learner"]]
    assert len(learners) == 1, [p.cmdline() for p in tree]
    t0 = time.monotonic()
    learners[0].kill()
    code = launch.wait(timeout=45)
    took = time.monotonic() - t0
    out = launch.output()
    errors = [line for line in out.splitlines() if "error" in line.lower() or "exitcode" in line]
    print(f"\nthe group stopped {took:.1f} s after rank 1's learner was killed:\n" + "\n".join(errors[-8:]))
    assert code != 0
    assert took < 30, f"the group took {took:.0f} s to stop\n{out[-3000:]}"
    assert "[rank 1] asyncrl: error: the learner was killed by SIGKILL" in out, out[-3000:]
    assert "relaunch every rank with --resume" in out
    assert list_checkpoints(str(run_dir))
    time.sleep(1)
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]
