"""A warm interpreter that starts asyncrl's console commands as forks of itself (`tests/launcher.py` drives it).

A fresh `asyncrl-train` spends about 2.3 s of CPU importing torch and asyncrl before it does anything; the
suite starts about a hundred of them. This process imports both once, without running a torch operation (so a
fork of it is as safe as the runner's own forks, `asyncrl.launch.check_can_fork`), then reads one JSON request a
line on stdin: `{"id", "tool", "args", "cwd", "env", "stdout", "stderr", "new_session"}`. For each it forks a
child that becomes the command with that argv, working directory, environment, sys.path and output files, and the
signal dispositions of a fresh interpreter: the console script's entry (`asyncrl.cli.console.<tool>`, which ends
the process as the script does), for a dotted tool such as `tests.faults` that module's `main(args)` as `python
-m` would run it, or for `script:PATH` the file PATH as `python PATH` would; these two end as the console scripts
do too (`exit_now`: no interpreter teardown). It answers `{"id", "pid"}` at once
and `{"exit": pid, "code"}` when a child ends (the code as subprocess reports it: negative for a signal). It exits
when stdin closes.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import runpy
import select
import signal
import sys

SCRIPT = "script:"  # a tool "script:PATH" runs the Python file PATH as `python PATH` would
TOOLS = ("train", "enjoy", "export", "plot", "compare", "diagnose", "sweep", "bench")
# What every run imports after its start (the runner's roles and its TensorBoard writer, about 0.15 s of CPU a run),
# and what the figure-writing tools import (asyncrl-compare --out, -plot, -diagnose and the scripts that draw:
# matplotlib's pyplot on Agg, 0.4-0.6 s of CPU each time); none of them starts a thread or runs a torch
# operation at import.
PRELOADED = ("asyncrl.runtime.roles.runner", "asyncrl.runtime.roles.learner", "asyncrl.runtime.roles.policy_worker",
             "asyncrl.runtime.roles.rollout_worker", "asyncrl.agents.appo.learner",
             "tensorboard.summary.writer.event_file_writer", "asyncrl.diagnostics.plots")
BIN_DIR = os.path.dirname(sys.executable)  # where the console scripts live: their sys.path[0]


class _Child(Exception):  # noqa: N818 - control flow: unwinds the serving loop in a fresh fork
    def __init__(self, request: dict) -> None:
        self.request = request


def _site_path() -> list[str]:
    """sys.path as a console script without PYTHONPATH sees it after its own directory."""
    extra = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if p and os.path.abspath(p) not in extra]


def serve(requests_fd: int, answers: io.TextIOBase) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes select through the wakeup fd
    pending = b""
    while True:
        ready, _, _ = select.select([requests_fd, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        while True:  # reap every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            answers.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
            answers.flush()
        if requests_fd not in ready:
            continue
        chunk = os.read(requests_fd, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            answers.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for fd in (requests_fd, wake_r, wake_w):
                    os.close(fd)
                answers.close()
                raise _Child(request)
            answers.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
            answers.flush()


def become(request: dict) -> int:
    """In the fork: set the process up as a fresh console script would be, then run the command."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["new_session"]:
        os.setsid()
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    streams = ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], append), (2, request["stderr"], append))
    for fd, path, flags in streams:
        target = os.open(path, flags, 0o644)
        if target != fd:
            os.dup2(target, fd)
            os.close(target)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, as at a fresh start
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    own = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [BIN_DIR, *own, *SITE_PATH]
    tool, args = request["tool"], request["args"]
    if tool.startswith(SCRIPT):  # `python PATH ARGS`: sys.path[0] is the script's directory
        path = tool[len(SCRIPT):]
        sys.path[0] = os.path.dirname(os.path.abspath(path))
        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")
        return 0
    if "." in tool:  # a module run as `python -m MODULE ARGS`: sys.path[0] is the working directory
        sys.path[0] = os.getcwd()
        module = importlib.import_module(tool)
        sys.argv = [module.__file__, *args]
        return module.main(args)
    sys.argv = [os.path.join(BIN_DIR, f"asyncrl-{tool}"), *args]
    getattr(importlib.import_module("asyncrl.cli.console"), tool)()  # what the console script calls: never returns
    raise AssertionError(f"asyncrl.cli.console.{tool} returned")


SITE_PATH = _site_path()

if __name__ == "__main__":
    import setproctitle
    import torch  # noqa: F401 - the point of this process: imported once, no operation run

    # setproctitle finds the memory of argv and environ at its first call; set up here, before a fork replaces
    # os.environ (after which the workers' titles, asyncrl-learner etc., would not show).
    setproctitle.getproctitle()

    for name in (*TOOLS, "console"):
        importlib.import_module(f"asyncrl.cli.{name}")
    for name in PRELOADED:
        importlib.import_module(name)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed here goes to stderr, never into the answers
    try:
        serve(0, answers)
        request = None
    except _Child as child:
        request = child.request
    if request is not None:  # in a fork, outside the handler (a traceback of the command shows no _Child)
        from asyncrl.cli.console import exit_now

        try:
            code = become(request)
        except SystemExit as stop:  # what sys.exit(code) in the command asked for, as the interpreter would end it
            if stop.code is not None and not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr)
                code = 1
            else:
                code = stop.code
        exit_now(code)
