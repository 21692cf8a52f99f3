"""`ray_train`: the train row with remote actor groups beside the local workers, through a Ray cluster of two
nodes started on this machine (loopback): as many remote groups as local workers, with as many envs each, so the
row moves half its trajectories through Ray. Its record adds what went through Ray (`remote_bytes_per_s`,
`remote_slots_per_s`, `remote_share`, `remote_lag_mean`, in `stages`) to the train row's figures."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.bench.settings import BenchSettings


def run_ray_train(s: BenchSettings) -> dict[str, Any]:
    from asyncrl.bench.ray_cluster import LocalCluster
    from asyncrl.bench.trainer import run_trainer

    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-ray-") as logs, \
            LocalCluster(Path(logs), head_cpus=0, node_cpus=(s.workers,)) as cluster:
        remote = ("--remote-workers", str(s.workers), "--remote-envs-per-worker", str(s.envs_per_worker),
                  "--ray", cluster.address)
        record = run_trainer(replace(s, mode="train", extra_trainer_args=(*s.extra_trainer_args, *remote)),
                             remote=True)
    record["mode"] = "ray_train"
    record["remote_workers"] = s.workers
    return record
