"""Learning through remote actor groups: docs/ray.md's figures, on a Ray cluster of two nodes started on this machine.

Starts a head node and one more (`asyncrl/bench/ray_cluster.py`, loopback, stopped at the end) and runs, per seed:
- `cartpole_remote`: README's CartPole command with every trajectory from 2 remote groups (`--workers 0`);
- `cartpole_mixed`: the same with 1 local worker and 1 remote group;
- `pendulum_sac_remote`: `--algo sac --frames 20000` on Pendulum-v1 with 1 remote group only (the preset's 8 envs).
Each run is judged by its best `episode_return_mean` (mean of the last 100 episodes) against the target (475,
475, -200); it prints a line per run, then the IQM of the final mean returns per case (asyncrl-compare's
statistics), and exits 1 unless every run reached its target.

    .venv/bin/python scripts/remote_actors_check.py                       # seeds 0 1 2, every case
    .venv/bin/python scripts/remote_actors_check.py --cases cartpole_remote --seeds 0
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
    returns = [r["episode_return_mean"] for r in records if r.get("episode_return_mean") is not None]
    steps = np.diff([0] + [r["env_steps"] for r in records])  # each record's interval
    remote = sum((r.get("remote_share") or 0) * n for r, n in zip(records, steps))
    return max(returns), returns[-1], remote / steps.sum() if steps.sum() else float("nan"), wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--keep", metavar="DIR", help="train here and keep the runs (default: a temporary directory)")
    args = p.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="asyncrl-remote-check-") as tmp:
        train_dir = Path(args.keep or tmp)
        with LocalCluster(Path(tmp), head_cpus=1, node_cpus=(1,)) as cluster:
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
