"""The engine's roles (policy worker, rollout worker, learner) forked from a hand-built wiring, as the runner forks
them, for tests that drive the queues and shared arrays themselves."""

from __future__ import annotations

import importlib
import multiprocessing as mp
from collections.abc import Iterable

from asyncrl.config import Config
from asyncrl.runtime.plumbing.channels import Channels
from asyncrl.runtime.plumbing.trajectories import num_slots
from asyncrl.runtime.plumbing.wiring import RunWiring


def fork_roles(wiring: RunWiring, names: Iterable[str]) -> list[mp.Process]:
    """Start the wiring's processes called `names` (e.g. "policy-0", "rollout-0", "learner")."""
    wanted = set(names)
    children = []
    for proc in wiring.processes:
        if proc.name in wanted:
            target = getattr(importlib.import_module(proc.module), proc.function)
            children.append(mp.get_context("fork").Process(target=target, args=proc.args, daemon=True))
    for child in children:
        child.start()
    return children


def stop_roles(wiring: RunWiring, children: list[mp.Process]) -> None:
    """Stop the run, join the children (killing any still there after 10 s) and free the wiring."""
    wiring.channels.request_stop()
    for child in children:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    wiring.close()


def supervised_channels(policy_workers: int, hang_timeout: float) -> tuple[Config, Channels]:
    """A tiny CartPole configuration with `policy_workers` and `hang_timeout`, and channels for it: what a test
    needs to judge hand-made processes with the runner's own Supervisor."""
    cfg = Config(env="CartPole-v1", workers=1, envs_per_worker=2, worker_splits=1, rollout=4, batch_size=8,
                 minibatches=1, policy_workers=policy_workers, hang_timeout=hang_timeout)
    cfg.validate()
    return cfg, Channels.create(cfg.workers, num_slots(cfg), cfg.policy_workers)
