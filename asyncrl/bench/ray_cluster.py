"""A Ray cluster of several nodes on this machine, advertised on loopback, for the remote actor tests and the
bench's `ray_train` row (what `ray start` does on real machines, one node per `ray start --block` process).

Each node is a `ray start --block` process of its own (the head first); stopping the cluster ends those processes
and every process under them, by PID, and checks none is left. `kill_node` kills one worker node's raylet with
SIGKILL, as a machine that drops off the cluster would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command, wherever this Python's ray is installed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, logs: Path, head_cpus: float = 1, node_cpus: tuple[float, ...] = (1,)):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.logs = logs
        self.nodes: list[subprocess.Popen] = []
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self._start(["--head", "--port", str(self.port), "--include-dashboard", "false",
                     "--dashboard-agent-listen-port", str(free_port())], head_cpus)
        for cpus in node_cpus:
            self._start(["--address", self.address], cpus)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self, args: list[str], cpus: float, timeout: float = 90.0) -> None:
        """Start a node and wait until it says it runs (`ray start` prints "Ray runtime started." once the node
        has joined), reading its log rather than starting `ray status` processes."""
        path = self.logs / f"node{len(self.nodes)}.log"
        log = open(path, "wb")  # noqa: SIM115 - the node's lifetime
        node = subprocess.Popen(
            [*RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(int(cpus)),
             "--disable-usage-stats", *args], stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.nodes.append(node)
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in path.read_bytes():
            if node.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Ray node {len(self.nodes) - 1} did not start (see {path})")
            time.sleep(0.1)

    def kill_node(self, index: int) -> int:
        """SIGKILL node `index`'s raylet (a worker node: 1..); its pid."""
        raylet = next(p for p in psutil.Process(self.nodes[index].pid).children(recursive=True)
                      if p.name() == "raylet")
        raylet.send_signal(signal.SIGKILL)
        return raylet.pid

    def stop(self) -> None:
        """End every node and whatever they started, at once (SIGKILL to each process of their trees, by PID:
        nothing of a test cluster needs a graceful stop); raise if a process is left."""
        tree = []
        for node in self.nodes:
            try:
                tree += [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for p in tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        for node in self.nodes:
            node.wait()
        _, alive = psutil.wait_procs(tree, timeout=10)
        if alive:
            raise RuntimeError(f"Ray processes left behind: {[p.pid for p in alive]}")
