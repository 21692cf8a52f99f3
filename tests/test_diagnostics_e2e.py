"""Planted faults in real runs (`asyncrl-train` in a subprocess): the profiler and health monitors must name them.

Each run is a few seconds of training on 2 rollout workers; the whole file takes about two minutes on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from asyncrl.diagnostics.metrics import read_metrics
from tests import launcher

TESTS = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--workers", "2", "--envs-per-worker", "4", "--batch-size", "256", "--report-interval", "1",
         "--device", "cpu"]
DIVERGENCE = {"entropy_collapse", "kl_high", "grad_spike", "value_exploding", "nonfinite"}


def command(name: str) -> list[str]:
    """The installed console script, or its module when the scripts are not on disk."""
    script = os.path.join(os.path.dirname(sys.executable), f"asyncrl-{name}")
    return [script] if os.path.exists(script) else [sys.executable, "-m", f"asyncrl.cli.{name}"]


def run_cli(name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    return launcher.run(name, list(args), timeout=timeout, env=env)


def train(train_dir, env: str, *args: str, seconds: float | None = 8) -> tuple[subprocess.CompletedProcess, str]:
    """A short run, bounded by `seconds` or (seconds=None) by a --frames given in `args`."""
    limit = [] if seconds is None else ["--seconds", str(seconds)]
    proc = run_cli("train", "--env", env, "--train-dir", str(train_dir), "--experiment", "run", *limit, *SMALL, *args)
    return proc, os.path.join(str(train_dir), "run")


def verdicts(records: list[dict]) -> Counter:
    """Verdicts in steady state: from the record in which the learner's first update reports its stage shares on.
    Before it, in start-up, the learner has had no batch (one record on a quiet machine; on one loaded 10x, where
    the first update of the big model below took 9 s, ten records in which the policy worker, waiting for a core
    90% of the time, read as inference-bound)."""
    steady = next((i for i, r in enumerate(records) if r.get("learner_wait_frac") is not None), len(records))
    return Counter(r["bottleneck"] for r in records[steady:] if r.get("bottleneck"))


def all_alerts(records: list[dict]) -> set[str]:
    return {code for r in records for code in r.get("alerts") or []}


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    """A CartPole whose every step sleeps 2 ms: the textbook environment-bound run (reused below)."""
    proc, run_dir = train(tmp_path_factory.mktemp("slow"), "tests.faults:make_slow_cartpole")
    assert proc.returncode == 0, proc.stderr
    return proc, run_dir


def test_slow_env_is_environment_bound(slow_run) -> None:
    proc, run_dir = slow_run
    records = read_metrics(run_dir)
    counts = verdicts(records)
    assert counts.most_common(1)[0][0] == "env" and counts["env"] > 0.5 * sum(counts.values()), counts
    assert "bottleneck: environment-bound" in proc.stdout and "--envs-per-worker" in proc.stdout
    # The last full interval (the last record is the one the run stopped in) in which the learner finished an
    # update: the learner's forward share comes with an update's timings, and on a loaded machine (20x) the last
    # full interval passed without one in 1 of 3 runs.
    last = next(r for prev, r in zip(records[-3::-1], records[-2:0:-1]) if r["policy_version"] > prev["policy_version"])
    for key in ("fps", "episode_return_mean", "entropy", "value_loss", "kl", "grad_norm", "policy_lag_mean",
                "queue_requests", "queue_full", "queue_free", "rss_mb_total", "rss_mb_rollout", "cpu_learner",
                "rollout_env_frac", "rollout_runq_frac", "policy_runq_frac", "learner_forward_frac", "alerts"):
        assert key in last, key
    # Start-up waits (the first weights, the first trajectory) are not booked as stage time.
    for r in records:
        shares = {k: v for k, v in r.items() if k.endswith("_frac") and isinstance(v, float)}
        assert all(v <= 1.0 + 1e-6 for v in shares.values()), shares
    assert {"runner", "learner", "policy-0", "rollout-0", "rollout-1"} <= set(last["procs"])


def test_big_model_on_tiny_env_is_training_bound(tmp_path) -> None:
    # Bounded by env steps (about 11 updates of 256), not wall-clock: on a busy machine it just takes longer. With
    # --hidden-size 2048 and 2,048 frames on a machine loaded 15-20x, three runs read training-bound in 71, 106 and 94
    # of 71, 106 and 94 steady-state records (the first update alone took 9-30 s there). At 1,024 units and 3,072
    # frames a run takes half the time (4.9 s against 9.9 s alone, 8.0-8.5 s against 15.4 s three at once) and
    # read training-bound in every steady-state record: 3, 5, 4 and 5 of them (be09760, 2026-12-07).
    proc, run_dir = train(tmp_path, "null", "--hidden-size", "1024", "--epochs", "4", "--frames", "3072",
                          seconds=None)
    assert proc.returncode == 0, proc.stderr
    counts = verdicts(read_metrics(run_dir))
    assert counts.most_common(1)[0][0] == "training" and counts["training"] >= 0.7 * sum(counts.values()), counts
    assert "bottleneck: training-bound" in proc.stdout


def test_an_update_longer_than_the_stage_window_still_reads_training_bound() -> None:
    """The big model above (at 2,048 units) on a loaded machine (figures from such a run): an update took 8-10 s,
    longer than the 5 s stage window, while the policy worker waits for a core most of the time (infer 0.8, of which
    0.8 in the run queue) and the rollout workers wait on both it and the slots. With no learner timings in the
    window the verdict used to fall to the workers' shares (inference-bound, CPU-starved); the learner's shares of
    its newest window stand until it reports again."""
    from asyncrl.diagnostics.aggregate import STAGE_WINDOW_S, Totals
    from asyncrl.diagnostics.bottleneck import classify

    totals = Totals()
    kinds = []
    for second in range(1, 21):
        totals.add_policy({"batches": 1, "samples": 8, "t_infer": 0.8, "t_wait": 0.2, "t_runq": 0.8, "t_total": 1.0})
        totals.add_rollout({"env_steps": 8, "episodes": [], "t_env": 0.0, "t_wait": 0.5, "t_wait_slot": 0.5,
                            "t_runq": 0.2, "t_total": 1.0})
        if second % 10 == 0:  # an update every 10 s, twice the window
            totals.add_learner({"t_wait": 0.0, "t_copy": 0.01, "t_train": 10.0})
        fractions = {**totals.stage_fractions(now=float(second)), "cpu_system": 100.0, "cpu_run": 10.0}
        totals.learner = []
        kinds.append(classify(fractions).kind if fractions["learner_wait_frac"] is not None else None)
    assert 10 > STAGE_WINDOW_S and kinds == [None] * 9 + ["training"] * 11, kinds


def test_nan_rewards_stop_the_run_and_keep_a_good_checkpoint(tmp_path) -> None:
    proc, run_dir = train(tmp_path, "tests.faults:make_nan_reward_cartpole", "--checkpoint-interval", "1",
                          seconds=40)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("asyncrl: error:")]
    assert len(error) == 1 and "NaN/Inf" in error[0] and "non-finite rewards" in error[0], proc.stderr
    assert "Traceback" not in proc.stderr
    records = read_metrics(run_dir)
    assert records[-1].get("fatal") and "nonfinite" in records[-1]["alerts"]
    assert records[-1]["time"] < 35  # stopped by the NaNs, not by --seconds

    import torch

    from asyncrl.runtime.store.checkpoint import load_latest_checkpoint

    _, state = load_latest_checkpoint(run_dir)
    weights = state["learner"]["model"]
    assert weights and all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_huge_learning_rate_trips_divergence_detectors(tmp_path) -> None:
    # Bounded by env steps (12 updates of 256), not 8 s of wall clock: entropy_collapse and kl_high were in the first
    # record (version 2-8) of every run seen; records every 0.25 s give the once-per-kind check 5-6 intervals.
    proc, run_dir = train(tmp_path, "CartPole-v1", "--lr", "10", "--frames", "3072", "--report-interval", "0.25",
                          seconds=None)
    records = read_metrics(run_dir)
    tripped = all_alerts(records) & DIVERGENCE
    assert tripped, [r.get("alerts") for r in records]
    for code in tripped:
        assert proc.stdout.count(f"warning [{code}]") <= 1  # printed once per kind, not every interval


# asyncrl-enjoy and asyncrl-diagnose run in this process (their main(), as test_engine_paths.py runs enjoy's): a
# fresh interpreter would spend seconds of CPU importing torch and matplotlib again. The installed console scripts
# themselves are run by test_doc_commands.py (the README's enjoy command) and test_video.py.
def test_enjoy_plays_the_checkpoint_and_saves_a_gif(slow_run, tmp_path, capsys) -> None:
    from PIL import Image

    from asyncrl.cli.enjoy import main as enjoy_main

    video = str(tmp_path / "episode.gif")
    capsys.readouterr()
    code = enjoy_main([slow_run[1], "--episodes", "2", "--video", video])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("episode ") >= 2 and "2 episodes: raw score mean" in out
    mean = float(out.split("raw score mean ")[1].split(",")[0])
    scores = [float(line.split("score ")[1].split()[0]) for line in out.splitlines() if line.startswith("episode ")]
    assert len(scores) == 2 and mean == pytest.approx(sum(scores) / 2, abs=1e-3), out
    # That a trained checkpoint beats an untrained one: test_engine_paths.py (this run trains for seconds only).
    assert Image.open(video).n_frames > 1


def test_diagnose_writes_a_report(slow_run, capsys) -> None:
    from asyncrl.cli.diagnose import main as diagnose_main

    capsys.readouterr()
    code = diagnose_main([slow_run[1]])
    out, err = capsys.readouterr()
    assert code == 0, err
    md_path = out.strip().splitlines()[-1]
    assert md_path == os.path.join(slow_run[1], "diagnosis.md")
    md = open(md_path).read()
    assert "**environment-bound**" in md and "## What to try next" in md
    for name in ("learning_curve", "throughput", "health", "stages", "resources"):
        assert os.path.getsize(os.path.join(slow_run[1], "diagnosis", f"{name}.png")) > 1000
