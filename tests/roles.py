"""The engine's roles (policy worker, rollout worker, learner) forked from a hand-built wiring, as the runner forks
them, for tests that drive the queues and shared arrays themselves."""

from __future__ import annotations

import importlib
import multiprocessing as mp
from collections.abc import Iterable

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
