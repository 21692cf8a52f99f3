"""The console scripts end through `asyncrl.cli.console.exit_now`: what a normal exit does for the program still
happens (atexit handlers, stdout and stderr flushed, non-daemon threads waited for, the exit code), and the
interpreter's teardown, which costs about half a second of CPU once torch is imported, does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncrl.cli import console

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from asyncrl.cli.console import exit_now

    class Finalised:  # its __del__ runs only in the interpreter's teardown (the module keeps it alive)
        def __del__(self):
            sys.__stderr__.write("torn down\\n")

    KEPT = Finalised()
    atexit.register(lambda: print("atexit ran"))
    if sys.argv[1] == "thread":
        def late_write():
            time.sleep(0.3)
            with open(sys.argv[2], "w") as f:
                f.write("written")
        threading.Thread(target=late_write).start()
    sys.stdout.write("buffered, no newline")  # a pipe: block-buffered until flushed
    exit_now(int(sys.argv[3]))
""")


def run_program(tmp_path: Path, mode: str, code: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM, mode, str(tmp_path / "late.txt"), str(code)],
                          capture_output=True, text=True, timeout=60)


def test_exit_now_keeps_the_exit_code_atexit_and_buffered_output_and_skips_the_teardown(tmp_path: Path) -> None:
    done = run_program(tmp_path, "plain", 3)
    assert done.returncode == 3
    assert done.stdout == "buffered, no newlineatexit ran\n"
    assert "torn down" not in done.stderr  # sys.exit would have run the teardown, and the finaliser with it


def test_exit_now_waits_for_a_running_thread_by_exiting_normally(tmp_path: Path) -> None:
    done = run_program(tmp_path, "thread", 0)
    assert done.returncode == 0
    assert (tmp_path / "late.txt").read_text() == "written"
    assert "atexit ran" in done.stdout


@pytest.mark.parametrize("tool", ["train", "bench", "diagnose", "enjoy", "plot", "compare", "sweep", "export"])
def test_every_console_script_enters_through_exit_now(tool: str) -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == f"asyncrl-{tool}"]
    assert script.value == f"asyncrl.cli.console:{tool}"
    assert callable(getattr(console, tool))
