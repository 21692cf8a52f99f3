"""Train CartPole-v1 with `--serial` over a few seeds and check that the run never made a child process.

Each seed is one `asyncrl.train(..., serial=True)` in a fresh Python process, stopped by a callback once the mean
return of the last 100 episodes reaches --target (else at --frames env steps). While it runs, this script samples
the process's children (psutil, every 25 ms), and inside it an audit hook records every attempt to
start a process (os.fork, subprocess.Popen, os.posix_spawn, os.system, exec): both must stay empty. One JSON line
per seed; the exit code is 1 when a seed missed the target or a child process was seen.

    .venv/bin/python scripts/serial_cartpole.py                          # 475 within 150,000 env steps, seeds 0 1 2
    .venv/bin/python scripts/serial_cartpole.py --seeds 3 --target 300   # what tests/test_serial.py runs
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

# The vector preset (asyncrl/agents/appo/presets.py) with twice the envs and batch (half the optimizer steps per
# sample: the serial loop spends most of its time in updates) and a higher rate, all given so that a preset change
# leaves the claim alone: 475 after 65,235, 103,926 and 117,591-119,124 env steps for seeds 0, 1, 2.
SETTINGS: dict[str, Any] = {
    "workers": 2, "envs_per_worker": 16, "rollout": 16, "batch_size": 512, "epochs": 8, "minibatches": 2, "lr": 2e-3,
    "lr_schedule": "auto", "value_coeff": 0.05, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.98,
    "vtrace_c": 0.8,
}
SAMPLE_S = 0.025  # the audit hook sees every attempt; this look only backs it up, at a few % of a core

CHILD = """\
import json, sys

SPAWNS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec", "subprocess.Popen",
          "_posixsubprocess.fork_exec")
spawned = []
sys.addaudithook(lambda event, args: spawned.append(event) if event in SPAWNS else None)

import asyncrl

target, frames, seed, train_dir, settings = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \\
    json.loads(sys.argv[5])
reached = []


def stop_at_target(record):
    if record["event"] == "metrics" and (record.get("episode_return_mean") or 0.0) >= target:
        reached.append({k: record[k] for k in ("env_steps", "time", "episode_return_mean")})
        return False
    return True


result = asyncrl.train(env="CartPole-v1", serial=True, frames=frames, seed=seed, train_dir=train_dir,
                       experiment="cartpole", report_interval=1.0, callbacks=[stop_at_target], **settings)
print("RESULT " + json.dumps({"reached": reached[0] if reached else None, "stop_reason": result.stop_reason,
                              "env_steps": result.metrics.get("env_steps"), "spawned": spawned,
                              "run_dir": result.run_dir}), flush=True)
"""


def run_seed(seed: int, target: float, frames: int, train_dir: str) -> dict[str, Any]:
    """One serial run, its children sampled while it runs: the run's RESULT line, with what was seen."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(target), str(frames), str(seed), train_dir,
                             json.dumps(SETTINGS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched, children, samples = psutil.Process(proc.pid), set(), 0
    while proc.poll() is None:
        try:
            children.update(f"{c.pid} {c.name()}" for c in watched.children(recursive=True))
        except psutil.Error:  # exited between the poll and the look
            break
        samples += 1
        time.sleep(SAMPLE_S)
    out, err = proc.communicate()
    line = next((line for line in out.splitlines() if line.startswith("RESULT ")), None)
    result = json.loads(line[len("RESULT "):]) if line else {"reached": None, "error": err.strip()[-2000:]}
    return {"seed": seed, "rc": proc.returncode, **result, "children": sorted(children), "samples": samples,
            "wall_s": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--frames", type=int, default=150_000, help="the env-step budget (--frames)")
    parser.add_argument("--train-dir", default="", help="keep the runs here (default: a temporary dir, removed)")
    args = parser.parse_args(argv)
    train_dir = args.train_dir or tempfile.mkdtemp(prefix="asyncrl-serial-")
    ok = True
    try:
        for seed in args.seeds:
            result = run_seed(seed, args.target, args.frames, f"{train_dir}/seed{seed}")
            print(json.dumps(result), flush=True)
            ok = ok and result["rc"] == 0 and result["reached"] is not None and not result["children"] \
                and not result.get("spawned")
    finally:
        if not args.train_dir:
            shutil.rmtree(train_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
