"""Every shell command in README.md and docs/*.md parses: ```bash blocks and the `$ ` lines of ```console blocks.

* Every `asyncrl-train` command (also under `torchrun`) is parsed and validated as `--print-config` does, with its
  placeholders filled in (S = 0 and 1, ENV, RUNS, F); commands that differ only in `--seed` must write different
  run directories (a second seed in the same directory is refused).
* Every other console script's command is parsed by that tool's own parser; a script's flags must be in its `--help`.
* A command nothing can run here is in SKIPS with its reason; a command that matches no rule fails the test.
* tests/test_doc_recipes.py runs every one of them, in its doc's order, with a tiny budget.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.doc_commands import (
    COMMANDS,
    ROOT,
    TOOLS,
    DocCommand,
    code_block_after,
    fill,
    has_seed_placeholder,
    kind,
    skip_reason,
    train_argv,
)


def by_kind(name: str) -> list:
    chosen = [c for c in COMMANDS if kind(c) == name]
    return [pytest.param(c, id=c.where) for c in chosen]


def test_examples_named_in_the_docs_exist() -> None:
    named = {w for c in COMMANDS for w in c.words if w.startswith("examples/")}
    assert named and not [w for w in named if not (ROOT / w).is_file()]


def test_the_docs_have_commands_and_every_one_is_classified() -> None:
    assert len(COMMANDS) > 40
    unclassified = [f"{c.where}: {c.text}" for c in COMMANDS if kind(c) == "unclassified"]
    assert not unclassified, "add a rule or a SKIPS entry (with its reason) for:\n" + "\n".join(unclassified)


@pytest.mark.parametrize("command", [pytest.param(c, id=c.where) for c in COMMANDS if kind(c) == "skip"])
def test_skipped_command(command: DocCommand) -> None:
    pytest.skip(f"{command.text[:60]}: {skip_reason(command)}")


def resolved_run_dir(argv: list[str]) -> str:
    """What `asyncrl-train ARGV --print-config` checks: the resolved settings, validated; returns the run directory."""
    from asyncrl.launch import validate
    from asyncrl.resolve import parse_command_line

    if "--config" in argv:  # README's run.yaml: the example file of docs/configuration.md
        Path(argv[argv.index("--config") + 1]).write_text(
            code_block_after("docs/configuration.md", "## Config files", "yaml"))
    if "--help" in argv:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit, match="^0$"):
            parse_command_line(argv)
        return "(help)"
    cfg = parse_command_line(argv).config
    validate(cfg)
    return cfg.run_dir


@pytest.mark.parametrize("command", by_kind("train"))
def test_train_command_validates(command: DocCommand, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = train_argv(command.words)
    assert argv is not None
    dirs = {resolved_run_dir(fill(argv, seed)) for seed in (0, 1)}
    if has_seed_placeholder(argv):
        assert len(dirs) == 2, f"{command.where}: every seed writes {dirs.pop()}; give --experiment seedS"


def test_seeds_of_one_block_write_different_run_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands in one doc block that differ only in --seed would be refused the second time if they shared a dir."""
    monkeypatch.chdir(tmp_path)
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, str]]] = {}
    for command in COMMANDS:
        argv = train_argv(command.words)
        if kind(command) != "train" or argv is None or "--seed" not in argv or "--resume" in argv:
            continue
        i = argv.index("--seed")
        others = tuple(argv[:i] + argv[i + 2:])
        block = command.where.rsplit(":", 1)[0]
        groups.setdefault((block, tuple(w for w in others if not w.startswith("seed"))), []).append(
            (command.where, resolved_run_dir(fill(argv, 0))))
    for runs in groups.values():
        dirs = [d for _, d in runs]
        assert len(set(dirs)) == len(dirs), f"seeds share a run directory: {runs}"


@cache
def tool_help(module: str) -> str:
    from importlib import import_module

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        import_module(f"asyncrl.cli.{module}").main(["--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", by_kind("tool"))
def test_tool_command_parses(command: DocCommand) -> None:
    """The tool's own parser accepts the command (missing arguments, unknown flags and bad values fail)."""
    from importlib import import_module

    module = import_module(f"asyncrl.cli.{TOOLS[command.words[0]]}")
    argv = fill(list(command.words[1:]), 0)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            if hasattr(module, "parse_args"):
                module.parse_args(argv)
            elif hasattr(module, "build_parser"):
                module.build_parser().parse_args(module.split_argv(argv)[0])
            else:
                missing = [w for w in argv if w.startswith("--") and w.split("=")[0] not in tool_help(TOOLS[
                    command.words[0]])]
                assert not missing, f"{command.words[0]} has no {missing}"
        except SystemExit:
            pytest.fail(f"{command.where}: {command.text}: {err.getvalue().strip()}")


@pytest.mark.parametrize("command", by_kind("inline"))
def test_inline_python_runs(command: DocCommand, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, *command.words[1:]], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"{command.where}: {result.stderr[-800:]}"


@cache
def script_help(script: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-500:]
    return result.stdout


@pytest.mark.parametrize("command", by_kind("script"))
def test_script_flags_exist(command: DocCommand) -> None:
    script = command.words[1]
    assert (ROOT / script).exists(), f"{command.where}: {script} does not exist"
    missing = [w for w in command.words[2:] if w.startswith("--") and w not in script_help(script)]
    assert not missing, f"{command.where}: {script} has no {missing}"
