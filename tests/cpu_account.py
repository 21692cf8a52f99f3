"""An opt-in pytest plugin: the CPU seconds the whole machine spent during each test (every process, from
/proc/stat), one JSON line a test in $CPU_ACCOUNT_OUT (default cpu_account.jsonl).

Meaningful with the tests run one at a time on an otherwise quiet machine (docs/performance.md):

    CPU_ACCOUNT_OUT=/tmp/cpu.jsonl .venv/bin/python -m pytest -q -p tests.cpu_account

A test's runs, policy workers and rollout workers are all counted, which pytest's durations (wall time, inflated
by whatever the other xdist worker runs) cannot show.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import pytest

HZ = os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds() -> float:
    """CPU seconds spent by the whole machine outside idle and I/O wait since boot (the `cpu` line of /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    cpu, wall = busy_cpu_seconds(), time.monotonic()
    yield
    record = {"id": item.nodeid, "cpu": busy_cpu_seconds() - cpu, "wall": time.monotonic() - wall}
    with open(os.environ.get("CPU_ACCOUNT_OUT", "cpu_account.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
