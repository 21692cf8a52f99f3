"""Start asyncrl's console commands (`asyncrl-train`, `asyncrl-enjoy`, ...) as forks of a warm interpreter.

Each test process keeps one `tests/zygote.py` (started at first use), which has imported torch and asyncrl once;
a command started here is a fork of it that runs the same `main()` as the console script, as a process of its
own (its pid, session, working directory, environment, sys.path, output files and exit code are those the
script would have), without paying the imports' 2-3 s of CPU again. `popen` and `run` mirror `subprocess.Popen`
and `subprocess.run(..., capture_output=True, text=True)` for what the tests use.

What differs from the installed script: the rollout workers fork from a runner that already has torch imported
(the script imports it after forking them), and every command shares the zygote's hash seed. Tests about the
script itself (its imports, packaging) and tests that compare two runs for an exact repeat start the real script.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.zygote import SCRIPT  # a tool "script:PATH": `python PATH ARGS`

ZYGOTE = Path(__file__).with_name("zygote.py")


class Launched:
    """A command forked by the zygote: the subset of `subprocess.Popen` the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.read_answers(0.0)
            self.returncode = self._zygote.exits.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._zygote.read_answers(1.0 if left is None else min(left, 1.0))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.exits: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self._ids = itertools.count()
        self._pending = b""
        self._fd = self.proc.stdout.fileno()

    def read_answers(self, timeout: float) -> None:
        """Take every answer the zygote has written, waiting up to `timeout` s for the first."""
        while select.select([self._fd], [], [], timeout)[0]:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                raise RuntimeError(f"the test launcher's zygote exited (code {self.proc.wait()})")
            self._pending += chunk
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                answer = json.loads(line)
                if "exit" in answer:
                    self.exits[answer["exit"]] = answer["code"]
                else:  # an exit recorded under this pid before now was an earlier command's (a reused pid)
                    self.pids[answer["id"]] = answer["pid"]
                    self.exits.pop(answer["pid"], None)
            timeout = 0.0

    def start(self, tool: str, args: list[str], stdout: Path, stderr: Path, cwd: str | Path | None,
              env: dict[str, str] | None, new_session: bool) -> Launched:
        for path in (stdout, stderr):  # there from the start, as with Popen's files (the child appends)
            open(path, "ab").close()
        request_id = next(self._ids)
        request = {"id": request_id, "tool": tool, "args": [str(a) for a in args], "cwd": str(cwd or os.getcwd()),
                   "env": dict(os.environ if env is None else env), "stdout": str(stdout), "stderr": str(stderr),
                   "new_session": new_session}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        while request_id not in self.pids:
            if time.monotonic() > deadline:
                raise RuntimeError("the test launcher's zygote did not answer within 60 s")
            self.read_answers(1.0)
        pid = self.pids.pop(request_id)  # its exit may be recorded already: read with its pid, it stays
        shown = [sys.executable, tool[len(SCRIPT):]] if tool.startswith(SCRIPT) else [f"asyncrl-{tool}"]
        return Launched(self, pid, [*shown, *request["args"]])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_zygote: Zygote | None = None


def _the_zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


# ASYNCRL_TESTS_FRESH=1: every command a new interpreter (the installed script), none a fork of the warm one.
FRESH = os.environ.get("ASYNCRL_TESTS_FRESH") == "1"


def script(tool: str) -> list[str]:
    """The command line a fresh interpreter runs for `tool`: the installed console script, `python -m`, or for
    `script:PATH` `python PATH`."""
    if tool.startswith(SCRIPT):
        return [sys.executable, tool[len(SCRIPT):]]
    if "." in tool:
        return [sys.executable, "-m", tool]
    installed = Path(sys.executable).with_name(f"asyncrl-{tool}")
    return [str(installed)] if installed.exists() else [sys.executable, "-m", f"asyncrl.cli.{tool}"]


def popen(tool: str, args: list[str], stdout: Path, stderr: Path, cwd: str | Path | None = None,
          env: dict[str, str] | None = None, start_new_session: bool = False,
          fresh: bool = False) -> Launched | subprocess.Popen[bytes]:
    """Start `asyncrl-<tool> ARGS` (or, for a dotted `tool`, `python -m tool ARGS`) with its output appended to the
    files `stdout` and `stderr`: a fork of the warm interpreter, or with `fresh` (or ASYNCRL_TESTS_FRESH=1) the
    command itself in a new interpreter."""
    if fresh or FRESH:
        with open(stdout, "ab") as out, open(stderr, "ab") as err:
            return subprocess.Popen([*script(tool), *map(str, args)], stdout=out, stderr=err, cwd=cwd, env=env,
                                    start_new_session=start_new_session)
    return _the_zygote().start(tool, args, stdout, stderr, cwd, env, start_new_session)


def run(tool: str, args: list[str], cwd: str | Path | None = None, env: dict[str, str] | None = None,
        timeout: float | None = None, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`asyncrl-<tool> ARGS` to completion, its output captured as text (as `subprocess.run` would)."""
    with tempfile.TemporaryDirectory(prefix="launch-") as logs:
        out, err = Path(logs, "stdout"), Path(logs, "stderr")
        proc = popen(tool, args, out, err, cwd, env, fresh=fresh)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
