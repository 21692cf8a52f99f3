"""Unit tests for the profiler verdicts, health detectors, decision tree, report and offline CLIs (no runs)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asyncrl.diagnostics.advice import FALLING, FLAT, RISING, SLOW, UNKNOWN, next_steps, trend
from asyncrl.diagnostics.aggregate import STAGE_WINDOW_S, Totals
from asyncrl.diagnostics.bottleneck import LABELS, REMEDIES, classify, dominant
from asyncrl.diagnostics.health import CODES, DETECTORS, Thresholds, detect, detect_over_run, entropy_floor
from asyncrl.diagnostics.monitor import RunMonitor
from asyncrl.diagnostics.resources import GpuSampler, ProcessSampler, parse_rows, summarize
from asyncrl.diagnostics.rundir import RunDirError, load_run
from asyncrl.diagnostics.video import VideoError, check_video_path, frame_from_obs, save_video
from asyncrl.runtime.plumbing.schedstat import run_queue_delay_s
from tests.run_records import FakeChannels, FakeProc, fractions, run_records

ROOT = Path(__file__).resolve().parent.parent


# ----- bottleneck verdicts -----
@pytest.mark.parametrize("fr, kind", [
    # learner waits, rollout workers busy stepping envs, policy worker idle
    (fractions(env=0.95, infer=0.10, lwait=0.95, copy=0.01, train=0.04), "env"),
    # rollout workers wait for actions while the policy worker is busy
    (fractions(env=0.07, infer=0.85, lwait=0.70, copy=0.01, train=0.29), "inference"),
    # learner busy training, rollout workers blocked on free slots
    (fractions(env=0.01, infer=0.30, lwait=0.02, copy=0.01, train=0.97), "training"),
    # learner saturated but mostly copying
    (fractions(env=0.05, infer=0.20, lwait=0.10, copy=0.60, train=0.30), "transfer"),
    # everybody waits: hand-offs between processes dominate
    (fractions(env=0.02, infer=0.10, lwait=0.95, copy=0.01, train=0.04), "transfer"),
    # both env and inference busy: the busier one
    (fractions(env=0.80, infer=0.60, lwait=0.50, copy=0.0, train=0.5), "env"),
    (fractions(env=0.50, infer=0.90, lwait=0.50, copy=0.0, train=0.5), "inference"),
    # sampling-only run (no training time): never training-bound
    (fractions(env=0.90, infer=0.20, lwait=1.0, copy=0.0, train=0.0), "env"),
    # rollout and policy workers blocked all interval (no timings) while the learner trains
    (fractions(lwait=0.0, copy=0.01, train=0.99), "training"),
])
def test_classify(fr: dict, kind: str) -> None:
    verdict = classify(fr)
    assert verdict is not None and verdict.kind == kind
    assert verdict.remedy == REMEDIES[kind]
    assert verdict.line().startswith(f"bottleneck: {LABELS[kind]} (")


def test_classify_needs_timings_and_quotes_context() -> None:
    assert classify({}) is None
    assert classify(fractions(env=0.9, lwait=0.9, copy=0.0, train=0.1)) is None  # no policy timings yet
    busy = {**fractions(env=0.9, infer=0.1, lwait=0.9, copy=0.0, train=0.1), "gpu_util": 12.0,
            "cpu_system": 99.0, "cpu_run": 20.0}
    reason = classify(busy).reason
    assert "GPU 12% busy" in reason and "other jobs" in reason
    quiet = {**busy, "cpu_system": 40.0}
    assert "other jobs" not in classify(quiet).reason


def test_workers_waiting_for_a_core_behind_other_jobs_are_cpu_starved_not_transfer_bound() -> None:
    waiting = fractions(env=0.10, infer=0.10, lwait=0.70, copy=0.0, train=0.30)
    starved = {**waiting, "rollout_runq_frac": 0.15, "policy_runq_frac": 0.35, "cpu_system": 100.0, "cpu_run": 11.0}
    verdict = classify(starved)
    assert verdict.kind == "starved" and verdict.remedy == REMEDIES["starved"]
    assert "policy workers 35%" in verdict.reason and "other jobs use 89%" in verdict.reason
    assert verdict.line().startswith("bottleneck: CPU-starved (")
    # The run's own processes queueing for the cores is its own load; a short run-queue delay is no starvation.
    assert classify({**starved, "cpu_run": 90.0}).kind == "transfer"
    assert classify({**starved, "rollout_runq_frac": 0.05, "policy_runq_frac": 0.05}).kind == "transfer"
    assert classify(waiting).kind == "transfer"  # no schedstat (another kernel): as before
    # A busy stage still names itself, with the starvation as evidence.
    env_bound = {**starved, "rollout_env_frac": 0.9, "rollout_wait_frac": 0.05}
    assert classify(env_bound).kind == "env" and "waiting for a core" in classify(env_bound).reason


def test_run_queue_delay_grows_while_another_process_holds_the_core() -> None:
    """Sharing one core with a busy loop, a busy loop's run-queue delay is the time it was off the core: the wall
    clock less its CPU time (whatever else the machine runs), and a fair share of it goes to the other loop."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint(flush=True)\n"
                            "while True: pass"], stdout=subprocess.PIPE)
    try:
        hog.stdout.readline()  # pinned, and spinning from now on
        os.sched_setaffinity(0, {cpu})
        start, ran0, t0 = run_queue_delay_s(), time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < 0.5:  # runnable all along, sharing one core with the hog
            pass
        waited, ran, wall = run_queue_delay_s() - start, time.thread_time() - ran0, time.monotonic() - t0
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    assert waited > 0.1, (waited, ran, wall)  # the hog's share: half the core with a fair scheduler, beside nothing
    assert abs(wall - ran - waited) < 0.03, (waited, ran, wall)


def test_run_queue_delay_is_the_second_schedstat_field(tmp_path) -> None:
    path = tmp_path / "schedstat"
    path.write_text("111000000 222000000 3\n")  # on-CPU ns, run-queue ns, timeslices
    assert run_queue_delay_s(str(path)) == 0.222
    assert run_queue_delay_s(str(tmp_path / "missing")) is None


def test_stage_shares_span_an_update_longer_than_the_report_interval() -> None:
    """A 2.5 s update reported at its end: the intervals around it stay training-bound, none reads above 100%."""
    totals = Totals()
    kinds = []
    for second in range(1, 11):
        totals.add_policy({"batches": 1, "samples": 8, "t_infer": 0.3, "t_wait": 0.7, "t_total": 1.0})
        done = second % 3 == 0
        totals.add_rollout({"env_steps": 8, "episodes": [], "t_env": 0.1, "t_wait": 0.1,
                            "t_wait_slot": 2.5 if done else 0.0, "t_total": 2.7 if done else 0.2})
        if done:
            totals.add_learner({"t_wait": 0.0, "t_copy": 0.05, "t_train": 2.5})
        fractions = totals.stage_fractions(now=float(second))
        totals.learner = []
        assert all(v is None or v <= 1.0 for k, v in fractions.items() if k.endswith("_frac")), fractions
        kinds.append(classify(fractions).kind if second >= 3 else None)
    assert kinds[2:] == ["training"] * 8, kinds
    # Older intervals leave the window once the newer ones span STAGE_WINDOW_S: with intervals longer than that,
    # the shares cover the newest two.
    later = Totals()
    shares = []
    for i, stage in enumerate(("t_wait", "t_train", "t_train")):
        later.learner = [{stage: 1.0}]
        shares.append(later.stage_fractions(now=i * (STAGE_WINDOW_S + 1))["learner_train_frac"])
    assert shares == [0.0, 0.5, 1.0]


def test_remedies_follow_the_guide() -> None:
    assert "--envs-per-worker" in REMEDIES["env"] and "vectorised" in REMEDIES["env"]
    assert "shared" in REMEDIES["transfer"]
    assert "--policy-workers" in REMEDIES["inference"]
    assert "mixed precision" in REMEDIES["training"] and "--batch-size" in REMEDIES["training"]


def test_dominant() -> None:
    assert dominant([None, "env", "env", "training", None]) == "env"
    assert dominant(["env", "training"]) == "training"  # tie: the later one
    assert dominant([None, "bogus"]) is None


# ----- health detectors -----
def codes(records: list[dict], **th) -> set[str]:
    return {a.code for a in detect(records, Thresholds(entropy_floor=entropy_floor(True, 2), **th))}


def test_healthy_run_has_no_alerts() -> None:
    recs = run_records(30)
    for i in range(1, 31):
        assert codes(recs[:i]) == set()
    assert detect([]) == []


def test_nonfinite() -> None:
    recs = run_records(5, nonfinite_updates=[0, 0, 0, 3, 3])
    assert "nonfinite" in codes(recs[:4])
    assert "nonfinite" not in codes(recs)  # no new skips in the last interval
    nan = run_records(3, value_loss=[1.0, 1.0, math.nan])
    assert "nonfinite" in codes(nan)
    returns = detect(run_records(2, episode_return_mean=[1.0, math.nan]))
    assert "NaN/Inf rewards" in returns[0].message
    fatal = run_records(2) + [{"time": 11.0, "frames": 30_000, "fatal": "boom", "alerts": ["nonfinite"]}]
    assert "nonfinite" in codes(fatal)


def test_entropy_collapse() -> None:
    floor = entropy_floor(True, 2)
    assert floor == pytest.approx(0.05 * math.log(2))
    assert "entropy_collapse" in codes(run_records(3, entropy=[0.69, 0.3, 0.01]))
    assert "entropy_collapse" not in codes(run_records(3, entropy=[0.69, 0.3, 0.2]))
    assert "entropy_collapse" not in {a.code for a in detect(run_records(3, entropy=[0.0] * 3))}  # no floor
    gaussian = entropy_floor(False, 2)
    assert gaussian < 2 * 1.4189 - 5  # stds shrunk 20-fold


def test_kl_high() -> None:
    assert "kl_high" in codes(run_records(2, kl=[0.001, 2.5]))
    assert "kl_high" not in codes(run_records(2, kl=[0.001, 0.05]))
    assert "kl_high" in codes(run_records(2, kl=[0.001, 0.05]), kl_max=0.01)


def test_grad_spike() -> None:
    assert "grad_spike" in codes(run_records(5, grad_norm_max=[6, 6, 6, 6, 500]))
    assert "grad_spike" not in codes(run_records(5, grad_norm_max=[6, 6, 6, 6, 30]))
    assert "grad_spike" not in codes(run_records(2, grad_norm_max=[6, 500]))  # too little history


def test_value_exploding() -> None:
    assert "value_exploding" in codes(run_records(5, value_loss=[10, 8, 5, 50, 5000]))
    assert "value_exploding" not in codes(run_records(5, value_loss=[10, 8, 5, 5000, 600]))  # falling again
    assert "value_exploding" not in codes(run_records(5, value_loss=[10, 20, 40, 80, 160]))


def test_core_saturated() -> None:
    assert "core_saturated" in codes(run_records(3, core_saturation=[0.0, 0.02, 0.3]))
    assert "core_saturated" not in codes(run_records(3, core_saturation=[0.3, 0.02, 0.004]))  # recovered
    found = detect(run_records(2, core_saturation=[0.0, 0.37]))
    assert found[0].code == "core_saturated" and "37%" in found[0].message and "--center-values" in found[0].fix


def test_fps_degrading() -> None:
    frames, total = [], 0
    for i in range(14):
        total += 10_000 if i < 8 else 2_000
        frames.append(total)
    assert "fps_degrading" in codes(run_records(14, frames=frames))
    # bursty reporting (every other interval empty) at a steady rate is not a degradation
    bursty = [10_000 * (i // 2 + 1) * 2 if i % 2 else 10_000 * (i // 2) * 2 + 1 for i in range(14)]
    assert "fps_degrading" not in codes(run_records(14, frames=bursty))


def test_queue_growing() -> None:
    assert "queue_growing" in codes(run_records(10, queue_requests=[2, 2, 2, 2, 3, 5, 8, 12, 20, 30]))
    assert "queue_growing" not in codes(run_records(10, queue_requests=[2, 2, 2, 2, 3, 5, 8, 12, 9, 30]))
    assert "queue_growing" not in codes(run_records(10, queue_full=[4] * 10))  # full but steady
    assert "queue_growing" not in codes(run_records(10, queue_full=[0] * 9 + [4]))  # empty, then filled once


def test_memory_growing() -> None:
    leak = run_records(12, rss_mb_total=lambda i: 800.0 + 60 * i)
    assert "memory_growing" in codes(leak)
    noisy = run_records(12, rss_mb_total=lambda i: 800.0 + (30 if i % 2 else 0))
    assert "memory_growing" not in codes(noisy)
    levelling_off = run_records(16, rss_mb_total=lambda i: 1900.0 - 900.0 * 0.7 ** i)  # a working set filling up
    assert "memory_growing" not in codes(levelling_off)


# The first 40 records (5 s apart) of a default Pong run at nice 19 beside two others: no frames for 20 s, the
# first update at 36 s, total RSS 1,106 -> 1,870 MB as buffers are first used, the full queue 0 -> 4 meanwhile.
PONG_START = {
    "frames": [0, 0, 0, 0, 7680, 13664, 17920, 21120, 24576, 28352, 30368, 32768, 35808, 39328, 41120, 44992,
               46784, 49184, 53248, 56352, 58560, 61568, 65536, 68640, 71584, 73728, 77824, 80160, 82208, 86016,
               89728, 92128, 94432, 98304, 102112, 106016, 107456, 110592, 113632, 115552],
    "policy_version": [1, 1, 1, 1, 1, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 8, 9, 10, 10, 11, 12, 13, 13, 14, 15, 16, 16,
                       17, 18, 18, 19, 20, 21, 22, 22, 23, 24, 24, 25, 26],
    "queue_full": [0.0, 0.0, 0.0, 0.0, 0.0, 3.14, 4.28, 3.71, 1.55, 1.43, 1.78, 2.67, 0.0, 1.4, 2.0, 0.76, 1.0,
                   1.56, 1.43, 1.0, 1.7, 0.95, 1.37, 0.4, 1.45, 2.71, 1.24, 0.84, 2.42, 1.38, 1.38, 1.8, 1.95, 2.33,
                   0.19, 1.19, 2.74, 1.1, 0.19, 1.5],
    "rss_mb_total": [1106.2, 1134.1, 1169.9, 1188.0, 1522.2, 1602.0, 1692.3, 1742.5, 1756.3, 1769.4, 1728.0,
                     1785.5, 1802.5, 1822.6, 1831.4, 1848.8, 1802.9, 1870.2, 1870.3, 1870.4, 1862.3, 1862.4, 1862.4,
                     1831.6, 1835.1, 1842.6, 1898.0, 1904.3, 1920.8, 1898.8, 1920.4, 1920.4, 1899.4, 1912.7, 1927.1,
                     1941.3, 1935.0, 1935.0, 1878.3, 1878.3],
}


def test_start_up_is_not_judged_and_a_leak_after_it_is() -> None:
    start = run_records(40, episode_return_mean=None, **PONG_START)
    assert detect_over_run(start) == {}  # each of memory, queue and throughput warned here before
    leaking = run_records(40, episode_return_mean=None, **{**PONG_START, "rss_mb_total": lambda i: 1100 + 40 * i})
    assert "memory_growing" in codes(leaking)
    queue = run_records(40, episode_return_mean=None, **{**PONG_START, "queue_requests": lambda i: max(0, i - 30)})
    assert "queue_growing" in codes(queue)
    # resumed: the second launch appends its own start-up to the same file; asyncrl-diagnose judges each launch
    # from the monitor's mark, as the monitor did
    second = run_records(40, episode_return_mean=None, **PONG_START)
    for r in second:
        r["time"] += start[-1]["time"] + 600.0
        r["frames"] += start[-1]["frames"]
        r["policy_version"] += start[-1]["policy_version"]
    assert "fps_degrading" in detect_over_run(start + second)  # one launch: the restart looks like a slowdown
    start[0]["launch_start"] = second[0]["launch_start"] = True
    assert detect_over_run(start + second) == {}
    # records from before the mark: a launch begins where every process is at its first CPU sample
    for r in (start[0], second[0]):
        del r["launch_start"]
        r["procs"] = {"runner": {"rss_mb": 290.0, "cpu": None}, "learner": {"rss_mb": 289.5, "cpu": None}}
    assert detect_over_run(start + second) == {}


def test_health_replay_counts_each_launchs_warnings(tmp_path, capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("health_replay", ROOT / "scripts" / "health_replay.py")
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    quiet = run_records(40, episode_return_mean=None, **PONG_START)
    leaking = run_records(40, episode_return_mean=None, **{**PONG_START, "rss_mb_total": lambda i: 1100 + 40 * i})
    quiet[0]["launch_start"] = leaking[0]["launch_start"] = True
    run = write_run(tmp_path / "run", quiet + leaking)
    assert replay.main([run]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{run} launch 1 (40 records): none", f"{run} launch 2 (40 records): memory_growing",
                     "2 launches, 1 warnings: memory_growing 1"]
    assert replay.main([str(tmp_path / "missing")]) == 2


def test_returns_flat() -> None:
    assert "returns_flat" in codes(run_records(12, episode_return_mean=[20.0] * 12))
    assert "returns_flat" not in codes(run_records(12))  # rising
    assert "returns_flat" not in codes(run_records(5, episode_return_mean=[20.0] * 5))  # too early
    warm_up = run_records(14, episode_return_mean=[-1200.0] * 12 + [-1190.0, -1180.0],
                          updates_total=[0] * 12 + [64, 128])
    assert "returns_flat" not in codes(warm_up)  # random actions before learning starts are not judged
    # a resumed Pong run: the checkpoint's mean repeats until new games end, a game every ~20 s
    resumed = run_records(30, episode_return_mean=[16.31] * 30, episodes=lambda i: 600 + i // 4)
    assert "returns_flat" not in codes(resumed)
    stuck = run_records(30, episode_return_mean=[16.31] * 30, episodes=lambda i: 600 + 20 * i)
    assert "returns_flat" in codes(stuck)  # the same mean over games 100 apart


def test_every_detector_has_a_code_and_detect_over_run() -> None:
    assert len(DETECTORS) == len(CODES)
    recs = run_records(6, kl=[0.0, 0.0, 3.0, 0.0, 0.0, 0.0])
    found = detect_over_run(recs)
    assert set(found) == {"kl_high"}
    assert "lower --lr" in found["kl_high"].fix
    assert "warning [kl_high]" in found["kl_high"].line()


# ----- decision tree -----
def test_trend() -> None:
    assert trend([1, 2, 3, 4, 5, 6, 7, 8, 9]) == RISING
    assert trend([5.0] * 9) == FLAT
    assert trend([9, 8, 7, 6, 5, 4, 3, 2, 1]) == FALLING
    assert trend([100, 100, 100, 101, 101, 101, 110, 110, 110]) == SLOW
    assert trend([1, 2]) == UNKNOWN


def test_next_steps_walks_the_tree() -> None:
    assert "Learning works" in next_steps(run_records(12))[-1]
    flat = run_records(12, episode_return_mean=[20.0] * 12)
    assert "data pipeline" in next_steps(run_records(12, episode_return_mean=[20.0] * 12,
                                                     value_loss=lambda i: 10.0 * (i + 1)))[-1]
    low = next_steps(run_records(12, episode_return_mean=[20.0] * 12, entropy=[0.01] * 12), entropy_floor=0.03)
    assert "--entropy-coeff" in low[-1]
    assert "Train longer" in next_steps(flat, entropy_floor=0.03)[-1]
    assert "Too few" in next_steps(run_records(2))[-1]


# ----- resources and the runner-side monitor -----
def test_resources() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"  # running Python, not half-way through exec
        sampler = ProcessSampler()
        first = sampler.sample({"learner": child.pid, "gone": 2**22 + 12345, "none": None})
        assert set(first) == {"runner", "learner"} and first["learner"]["cpu"] is None
        second = sampler.sample({"learner": child.pid})
        assert second["learner"]["cpu"] is not None and second["learner"]["rss_mb"] > 1
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    flat = summarize({"rollout-0": {"rss_mb": 10.0, "cpu": 5.0}, "rollout-1": {"rss_mb": 20.0, "cpu": None},
                      "learner": {"rss_mb": 100.0, "cpu": 90.0}})
    assert flat == {"rss_mb_total": 130.0, "rss_mb_rollout": 30.0, "cpu_rollout": 5.0, "cpu_total": 95.0,
                    "rss_mb_learner": 100.0, "cpu_learner": 90.0}
    assert parse_rows([[50.0, 1000.0, 8000.0], [70.0, 500.0, 8000.0]]) == {
        "gpu_util": 60.0, "gpu_mem_mb": 1500.0, "gpu_mem_total_mb": 16000.0}
    assert GpuSampler(enabled=False).sample() == {}


def test_a_workers_own_processes_count_as_the_runs() -> None:
    """A rollout worker's children (a VizDoom engine, a duel's players) are the run's CPU, not other jobs': a
    named process whose grandchild spins shows it under `children-<name>`, summed into cpu_total."""
    spin = "import time; t = time.time() + 30\nprint('spinning', flush=True)\nwhile time.time() < t: pass"
    # "up" only once the grandchild runs: a first sample taken while it was still starting read no memory for it
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               f"g = subprocess.Popen([sys.executable, '-c', {spin!r}], stdout=subprocess.PIPE); "
                               "g.stdout.readline(); print('up', flush=True); "
                               "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "up"
        grandchild = psutil.Process(parent.pid).children()[0]

        def spun() -> tuple[float, float]:  # the grandchild's CPU seconds, and when
            return sum(grandchild.cpu_times()[:2]), time.monotonic()

        sampler = ProcessSampler()
        outer0 = spun()
        first = sampler.sample({"rollout-0": parent.pid})
        inner0 = spun()
        assert first["children-rollout-0"]["cpu"] is None and first["children-rollout-0"]["rss_mb"] > 1
        time.sleep(0.5)
        inner1 = spun()
        second = sampler.sample({"rollout-0": parent.pid})
        outer1 = spun()
        # the grandchild's share of a core between the samples, whatever else the machine runs: within what it
        # spun over the windows just inside and just outside the sampler's
        low = 100 * (inner1[0] - inner0[0]) / (outer1[1] - outer0[1])
        high = 100 * (outer1[0] - outer0[0]) / (inner1[1] - inner0[1])
        assert low - 0.1 <= second["children-rollout-0"]["cpu"] <= high + 0.1 and low > 1, (second, low, high)
        assert second["rollout-0"]["cpu"] < 10  # the sleeping parent: its grandchild's work is not booked to it
        assert summarize(second)["cpu_children"] == second["children-rollout-0"]["cpu"]
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_gpu_sampler_reads_nvidia_smi(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '55, 1024, 81920'\necho '65, 2048, 81920'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = GpuSampler()
    assert sampler.sample() == {"gpu_util": 60.0, "gpu_mem_mb": 3072.0, "gpu_mem_total_mb": 163840.0}
    fake.write_text("#!/bin/sh\necho '[N/A], 1, 2'\n")
    assert sampler.sample() == {} and sampler.binary is None  # disabled after a failure


def test_monitor_adds_fields_and_prints_each_alert_once() -> None:
    from asyncrl.config import Config
    from asyncrl.envs.null_env import NULL_SPEC

    lines: list[str] = []
    cfg = Config(env="null", device="cpu", epochs=1, minibatches=4)
    monitor = RunMonitor(cfg, NULL_SPEC, out=lambda s, **_: lines.append(s))
    channels = FakeChannels()
    learner = [{"t_wait": 0.1, "t_copy": 0.0, "t_train": 0.9, "t_forward": 0.1, "t_backward": 0.05,
                "t_optim": 0.01, "grad_norm": 7.0}]
    for i in range(3):
        monitor.sample_queues(channels)
        record = {**run_records(3)[i], **fractions(env=0.9, infer=0.1, lwait=0.9, copy=0.0, train=0.1),
                  "kl": 5.0, "entropy": 0.69}
        extra = monitor.observe(record, learner, {"learner": FakeProc()}, channels)
        monitor.flush()
    assert extra["queue_requests"] == 3.0 and extra["bottleneck"] == "env"
    assert extra["alerts"] == ["kl_high"] and extra["grad_norm_max"] == 7.0
    assert [r.get("launch_start") for r in monitor.history] == [True, None, None]  # where this launch began
    assert extra["learner_forward_frac"] == pytest.approx(0.1 * 4)  # per-step times x 1 epoch x 4 minibatches
    # the "learner" here is this test process: its own children (the tests' launcher) come as children-learner
    assert set(extra["procs"]) - {"children-learner"} == {"runner", "learner"} and extra["rss_mb_total"] > 0
    assert sum("warning [kl_high]" in line for line in lines) == 1
    assert sum("bottleneck: environment-bound" in line for line in lines) == 1  # printed when it changes
    json.dumps(extra)  # everything must be writable to metrics.jsonl


# ----- run directories, video, offline CLIs -----
def write_run(path, records: list[dict], config: dict | None = None) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write('{"time": 1')  # a record being written right now
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config or {"env": "null", "report_interval": 5.0}, f)
    return str(path)


def test_load_run_errors(tmp_path) -> None:
    with pytest.raises(RunDirError, match="no run directory"):
        load_run(str(tmp_path / "missing"))
    with pytest.raises(RunDirError, match="no metrics.jsonl"):
        load_run(str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(RunDirError, match="no records yet"):
        load_run(str(tmp_path))
    run = load_run(write_run(tmp_path / "run", run_records(3)))
    assert len(run.records) == 3 and run.config["env"] == "null"


def test_video(tmp_path) -> None:
    import numpy as np
    from PIL import Image

    stack = np.random.randint(0, 255, (4, 84, 84), dtype=np.uint8)
    assert frame_from_obs(stack).shape == (252, 252)
    assert (frame_from_obs(stack)[:3, :3] == stack[-1, 0, 0]).all()
    bars = frame_from_obs(np.array([0.5, -2.0, np.nan, 0.0], dtype=np.float32))
    assert bars.dtype == np.uint8 and bars.shape[1] == 4 * 32
    path = save_video([frame_from_obs(stack + i) for i in range(3)], str(tmp_path / "a.gif"))
    assert Image.open(path).n_frames == 3
    with pytest.raises(VideoError, match="unknown video format"):
        check_video_path(str(tmp_path / "a.avi"))
    with pytest.raises(VideoError, match="no directory"):
        check_video_path(str(tmp_path / "nope" / "a.gif"))


def test_diagnose_and_plot_on_synthetic_run(tmp_path, capsys) -> None:
    from asyncrl.cli import diagnose, plot

    recs = run_records(12, kl=lambda i: 3.0 if i == 6 else 0.001, entropy_floor=[0.03] * 12,
                       bottleneck=["env"] * 10 + ["training"] * 2,
                       **fractions(env=0.9, infer=0.1, lwait=0.9, copy=0.0, train=0.1))
    run = write_run(tmp_path / "run", recs)
    assert diagnose.main([run]) == 0
    md_path = capsys.readouterr().out.strip()
    assert md_path == os.path.join(run, "diagnosis.md")
    md = open(md_path).read()
    assert "**environment-bound** in 9 of 11" in md and "kl_high" in md and "Learning works" in md
    for name in ("learning_curve", "throughput", "health", "stages", "resources"):
        assert os.path.getsize(os.path.join(run, "diagnosis", f"{name}.png")) > 1000
        assert f"(diagnosis/{name}.png)" in md
    other = write_run(tmp_path / "other", run_records(5))
    out = str(tmp_path / "curves.png")
    assert plot.main([run, other, "--x", "time", "--out", out]) == 0
    assert os.path.getsize(out) > 1000


def test_plot_seeds_curve_writes_csv_and_png(tmp_path) -> None:
    """`asyncrl-plot RUN... --seeds-curve OUT` (the real command): OUT.csv and OUT.png over the runs as seeds."""
    runs = [write_run(tmp_path / f"seed{i}", run_records(6)) for i in range(2)]
    out = tmp_path / "curves" / "cartpole"
    result = subprocess.run([sys.executable, "-m", "asyncrl.cli.plot", *runs, "--seeds-curve", str(out),
                             "--levels", "0", "1e9"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "curves" / "cartpole.csv").read_text().splitlines()
    assert rows[0].startswith("frames,return_mean,return_min,return_max,wall_seconds_mean") and len(rows) == 201
    assert os.path.getsize(tmp_path / "curves" / "cartpole.png") > 1000
    assert "+1e+09: not reached" in result.stdout and f"wrote {out}.csv and {out}.png" in result.stdout
    empty = subprocess.run([sys.executable, "-m", "asyncrl.cli.plot", str(tmp_path / "nope"), "--seeds-curve",
                            str(out)], capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1, empty.stderr


@pytest.mark.parametrize("module, extra", [("diagnose", []), ("plot", []), ("enjoy", ["--episodes", "1"])])
def test_cli_bad_input_is_one_line(module: str, extra: list[str], tmp_path, capsys) -> None:
    import importlib

    main = importlib.import_module(f"asyncrl.cli.{module}").main
    assert main([str(tmp_path / "missing"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncrl-{module}: error: no run directory") and err.count("\n") == 1


def test_enjoy_without_checkpoint(tmp_path, capsys) -> None:
    from asyncrl.cli import enjoy

    assert enjoy.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no usable checkpoint" in err and err.count("\n") == 1


def fake_checkpoint(run_dir: str, hidden_size: int = 64) -> None:
    from asyncrl.config import Config
    from asyncrl.envs.null_env import NULL_SPEC
    from asyncrl.models.actor_critic import build_model
    from asyncrl.runtime.store.checkpoint import save_checkpoint

    model = build_model(NULL_SPEC, hidden_size)
    save_checkpoint(run_dir, 7, {"learner": {"model": model.state_dict(), "version": 7}, "env_steps": 0,
                                 "config": Config(env="null").to_json(), "env": "null"}, keep=1)


def test_enjoy_plays_a_vector_env_and_draws_bars(tmp_path, capsys) -> None:
    from PIL import Image

    from asyncrl.cli import enjoy
    from asyncrl.envs.null_env import EPISODE_LEN

    fake_checkpoint(str(tmp_path))
    video = str(tmp_path / "null.gif")
    assert enjoy.main([str(tmp_path), "--episodes", "2", "--greedy", "--video", video]) == 0
    out = capsys.readouterr().out
    assert f"2 episodes: raw score mean {EPISODE_LEN:g}, std 0" in out and "policy version 7" in out
    assert Image.open(video).size == (4 * 32, 128)


def test_enjoy_rejects_a_checkpoint_of_another_model(tmp_path, capsys) -> None:
    from asyncrl.cli import enjoy

    fake_checkpoint(str(tmp_path), hidden_size=32)  # the saved config says 64
    assert enjoy.main([str(tmp_path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not match the model" in err and err.count("\n") == 1


def test_blocked_workers_mean_training_bound_when_the_learner_is_mid_update() -> None:
    from asyncrl.diagnostics.bottleneck import classify

    record = {"rollout_env_frac": 0.0, "rollout_wait_slot_frac": 0.96, "policy_infer_frac": 0.14,
              "learner_wait_frac": None, "learner_train_frac": None}
    assert classify(record).kind == "training"
