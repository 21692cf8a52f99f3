"""Learning through remote actor groups: docs/ray.md's figures, on a Ray cluster of two nodes started on this machine.

Starts a head node and one more (`asyncrl/bench/ray_cluster.py`, loopback, stopped at the end) and runs, per seed:
- `cartpole_remote`: README's CartPole command with every trajectory from 2 remote groups (`--workers 0`);
- `cartpole_mixed`: the same with 1 local worker and 1 remote group;
- `pendulum_sac_remote`: `--algo sac --frames 20000` on Pendulum-v1 with 1 remote group only (the preset's 8 envs).
Each run is judged by its best `episode_return_mean` (mean of the last 100 episodes) against the target (475,
475, -200), Pendulum by `episode_return_mean_20` (the last 20 episodes, as results.md's SAC figure: at 20k steps
the last 100 still hold the warm-up's random-action episodes); it prints a line per run, then the IQM of the final
mean returns per case (asyncrl-compare's statistics), and exits 1 unless every run reached its target.

    .venv/bin/python scripts/remote_actors_check.py                       # seeds 0 1 2, every case
    .venv/bin/python scripts/remote_actors_check.py --cases cartpole_remote --seeds 0
    .venv/bin/python scripts/remote_actors_check.py --pong 60             # throughput and lag instead

`--pong SECONDS` runs atari_pong with 2 local workers, then with 2 local workers and 2 remote groups (16 envs each,
as the local ones), SECONDS each, and prints for each the median frames/s over the records after the first two,
the learner's policy lag (mean of the records' means, largest max), the share of steps dropped as stale, and for
the remote trajectories their arrival lag (mean, max) and share of the steps.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from asyncrl.bench.ray_cluster import LocalCluster
from asyncrl.diagnostics.compare import bootstrap_ci, iqm
from asyncrl.diagnostics.metrics import read_metrics

CARTPOLE = ["--env", "CartPole-v1", "--frames", "500000"]
RETURN = {"pendulum_sac_remote": "episode_return_mean_20"}  # the key each case is judged by (else the 100-episode mean)
CASES: dict[str, tuple[list[str], float]] = {
    "cartpole_remote": ([*CARTPOLE, "--workers", "0", "--remote-workers", "2"], 475.0),
    "cartpole_mixed": ([*CARTPOLE, "--workers", "1", "--remote-workers", "1"], 475.0),
    "pendulum_sac_remote": (["--env", "Pendulum-v1", "--algo", "sac", "--frames", "20000", "--workers", "0",
                             "--remote-workers", "1"], -200.0),
}
TRAIN = str(Path(sys.executable).with_name("asyncrl-train"))


def run(case: str, seed: int, address: str, train_dir: Path) -> tuple[float, float, float, float]:
    """(best mean return, final mean return, remote share of the steps, wall seconds) of one run."""
    args, _ = CASES[case]
    t0 = time.monotonic()
    proc = subprocess.run([TRAIN, *args, "--ray", address, "--seed", str(seed), "--train-dir", str(train_dir),
                           "--experiment", f"{case}_s{seed}"], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode:
        sys.exit(f"{case} seed {seed} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    records = read_metrics(str(train_dir / f"{case}_s{seed}"))
    key = RETURN.get(case, "episode_return_mean")
    returns = [r[key] for r in records if r.get(key) is not None]
    steps = np.diff([0] + [r["env_steps"] for r in records])  # each record's interval
    remote = sum((r.get("remote_share") or 0) * n for r, n in zip(records, steps))
    return max(returns), returns[-1], remote / steps.sum() if steps.sum() else float("nan"), wall


def pong(seconds: float, address: str, train_dir: Path) -> None:
    """2 local workers against 2 local + 2 remote groups on Pong: throughput and lag, one run each."""
    base = [TRAIN, "--env", "atari_pong", "--workers", "2", "--envs-per-worker", "16", "--seconds", str(seconds),
            "--report-interval", "5", "--train-dir", str(train_dir)]
    for name, extra in (("2 local", []), ("2 local + 2 remote", ["--remote-workers", "2", "--ray", address])):
        exp = name.replace(" ", "_").replace("+", "and")
        proc = subprocess.run([*base, "--experiment", exp, *extra], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"pong {name} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        records = [r for r in read_metrics(str(train_dir / exp)) if r["env_steps"] > 0][2:]
        fps = float(np.median([r["fps"] for r in records]))
        lag = [r["policy_lag_mean"] for r in records if r.get("policy_lag_mean") is not None]
        lag_max = max((r.get("policy_lag_max") or 0 for r in records), default=0)
        last = records[-1]
        dropped = last.get("dropped_stale", 0) / max(last["env_steps"], 1)
        line = (f"pong {name}: median {fps:,.0f} frames/s over {len(records)} records; learner policy lag mean "
                f"{np.mean(lag):.2f} max {lag_max}; dropped {dropped:.1%}")
        remote = [r for r in records if r.get("remote_lag_mean") is not None]
        if remote:
            share = float(np.median([r["remote_share"] for r in remote]))
            line += (f"; remote trajectories: {share:.0%} of the steps, arrival lag mean "
                     f"{np.mean([r['remote_lag_mean'] for r in remote]):.2f} max "
                     f"{max(r['remote_lag_max'] for r in remote)}, "
                     f"{np.median([r['remote_bytes_per_s'] for r in remote]) / 1e6:.1f} MB/s")
        print(line, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--keep", metavar="DIR", help="train here and keep the runs (default: a temporary directory)")
    p.add_argument("--pong", type=float, metavar="SECONDS", help="Pong throughput and lag instead (see above)")
    args = p.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="asyncrl-remote-check-") as tmp:
        train_dir = Path(args.keep or tmp)
        with LocalCluster(Path(tmp), head_cpus=0 if args.pong else 1, node_cpus=(2 if args.pong else 1,)) as cluster:
            if args.pong:
                pong(args.pong, cluster.address, train_dir)
                return 0
            for case in args.cases:
                finals = []
                for seed in args.seeds:
                    best, final, share, wall = run(case, seed, cluster.address, train_dir)
                    target = CASES[case][1]
                    ok &= best >= target
                    finals.append(final)
                    print(f"{case} seed {seed}: best {best:.2f}, final {final:.2f} (target {target:g}: "
                          f"{'reached' if best >= target else 'NOT reached'}); {share:.0%} of the steps remote; "
                          f"{wall:.0f} s", flush=True)
                ci = bootstrap_ci(np.asarray(finals), iqm)
                interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
                print(f"{case}: IQM of the final mean returns {float(iqm(np.asarray(finals))):.2f}{interval} over "
                      f"{len(finals)} seeds", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
