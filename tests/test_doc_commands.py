"""Every shell command in README.md and docs/*.md still works: ```bash blocks and the `$ ` lines of ```console blocks.

* Every `asyncrl-train` command (also under `torchrun`) is parsed and validated as `--print-config` does, with its
  placeholders filled in (S = 0 and 1, ENV, RUNS, F); commands that differ only in `--seed` must write different
  run directories (a second seed in the same directory is refused).
* Every other console script's command is parsed by that tool's own parser; a script's flags must be in its `--help`.
* The recipes a newcomer runs first (README's first run with its plot, video and exports, the custom env, SAC,
  the sweep file) run end to end, with `--frames` cut to a few hundred steps: each `asyncrl-*` command is its
  console script's main() with the doc's arguments, a fork of the tests' warm interpreter (tests/launcher.py);
  the installed scripts themselves are run by tests/test_packaging.py and tests/test_video.py.
* A command nothing can run here is in SKIPS with its reason; a command that matches no rule fails the test.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests import launcher

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)  # also inside list items

# (pattern searched in the command, why it is not run here): shown as the skip reason of each such command.
SKIPS: list[tuple[str, str]] = [
    (r"^make (train|test)\b", "hours (Pong) or the whole suite; the coordinator runs make test"),
    (r"^make bench\b", "the benchmark suite takes 5-25 min"),
    (r"^(\.venv/bin/)?pip (install|wheel)", "installs from the network (tests/test_packaging.py builds the wheel)"),
    (r"^make install\b", "installs into .venv, the venv these tests run from"),
    (r"^source ", "changes the calling shell"),
    (r"^tensorboard ", "a server that runs until stopped"),
    (r"^scripts/soak\.sh", "a soak run of minutes to hours"),
    (r"^scripts/(fetch_gpu_wheels|gpu_check)\.sh", "the CUDA check's scripts: run on a GPU machine"),
    (r"^python scripts/envpool_vs_gym\.py", "needs envpool, which is not installed"),
    (r"^asyncrl-sweep sweep\.yaml --concurrent", "six training runs; the --dry-run line beside it runs here"),
    (r"^(\.venv/bin/python |python )?examples/", "an example: tests/test_examples.py runs each with a tiny budget"),
]
TOOLS = {"asyncrl-compare": "compare", "asyncrl-enjoy": "enjoy", "asyncrl-export": "export", "asyncrl-sweep": "sweep",
         "asyncrl-plot": "plot", "asyncrl-diagnose": "diagnose", "asyncrl-bench": "bench"}
PLACEHOLDERS = {"ENV": "HalfCheetah-v5", "RUNS": "runs", "F": "1000", "RUN_DIR": "train_dir/CartPole-v1"}


@dataclass(frozen=True)
class DocCommand:
    """One shell command of a doc: its steps (split at `&&`), each a list of words."""

    where: str
    text: str
    steps: tuple[tuple[str, ...], ...]

    @property
    def words(self) -> tuple[str, ...]:
        """The last step: the command itself (earlier steps are `cd DIR`)."""
        return self.steps[-1]


def _lines(lang: str, body: str) -> list[str]:
    if lang == "bash":
        return body.splitlines()
    if lang == "console":
        return [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    return []


def split_steps(words: list[str]) -> tuple[tuple[str, ...], ...]:
    """`cd runs && asyncrl-compare ...` -> (("cd", "runs"), ("asyncrl-compare", ...))."""
    steps: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            steps.append([])
        else:
            steps[-1].append(word)
    return tuple(tuple(step) for step in steps)


def doc_commands() -> list[DocCommand]:
    """The shell commands of every doc, continuation lines joined and comments dropped."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for block in FENCE.finditer(text):
            first = text[:block.start()].count("\n") + 2
            pending, start = "", 0
            for i, line in enumerate(_lines(block.group(1), textwrap.dedent(block.group(2)))):
                start = start if pending else first + i
                pending += line.strip() if pending else line.rstrip()
                if pending.endswith("\\"):
                    pending = pending[:-1] + " "
                    continue
                words = shlex.split(pending, comments=True)
                pending = ""
                if words:
                    found.append(DocCommand(f"{path.relative_to(ROOT)}:{start}", shlex.join(words), split_steps(words)))
    return found


COMMANDS = doc_commands()


def skip_reason(command: DocCommand) -> str | None:
    text = shlex.join(command.words)
    return next((reason for pattern, reason in SKIPS if re.search(pattern, text)), None)


def train_argv(words: tuple[str, ...]) -> list[str] | None:
    """The asyncrl-train flags of an `asyncrl-train` or `[torchrun ...] -m asyncrl.train` command (None if neither)."""
    words = tuple(w for w in words if not re.match(r"^[A-Z_]+=", w))  # WANDB_MODE=offline asyncrl-train ...
    if words and words[0] == "asyncrl-train":
        return list(words[1:])
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "asyncrl.train":
            return list(words[i + 2:])
    return None


def kind(command: DocCommand) -> str:
    """train, tool, script, inline or skip; "unclassified" fails test_every_command_is_classified."""
    if skip_reason(command):
        return "skip"
    if train_argv(command.words) is not None:
        return "train"
    first = command.words[0]
    if first in TOOLS:
        return "tool"
    if first in ("python", ".venv/bin/python") and command.words[1].startswith("scripts/"):
        return "script"
    if first in ("python", ".venv/bin/python") and command.words[1] == "-c":
        return "inline"
    return "unclassified"


def fill(words: list[str], seed: int) -> list[str]:
    """Placeholders filled in: seed S (also in seedS), ENV, RUNS, F; `[--opt X]` synopsis brackets dropped."""
    out = []
    for word in words:
        if word.startswith("[-"):  # a synopsis bracket, not a JSON list such as --policy-settings '[{}, {}]'
            word = word[1:]
        if word.endswith("]") and "[" not in word:
            word = word[:-1]
        word = "/".join(PLACEHOLDERS.get(part, part) for part in word.split("/"))
        word = re.sub(r"(?<=seed)S\b", str(seed), word)
        out.append(str(seed) if word == "S" else word)
    return [w for w in out if w not in ("...", "")]


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
    if "S" in argv or any(w.endswith("seedS") for w in argv):
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


# ---- the first recipes, run end to end ----

BUDGET_FRAMES = "600"


def find(doc: str, prefix: str) -> DocCommand:
    """The command of docs file `doc` that starts with `prefix` (the test fails when a doc drops it)."""
    matches = [c for c in COMMANDS if c.where.startswith(doc + ":") and c.text.startswith(prefix)]
    assert matches, f"{doc} no longer has a command starting with {prefix!r}"
    return matches[0]


def budgeted(words: list[str], frames: str = BUDGET_FRAMES) -> list[str]:
    """asyncrl-train flags with --frames cut to `frames` (added when the command has none) and --seconds dropped."""
    out, i = [], 0
    while i < len(words):
        if words[i] in ("--frames", "--seconds"):
            i += 2
            continue
        out.append(words[i])
        i += 1
    return [*out, "--frames", frames]


def venv_bin(name: str) -> str:
    local = ROOT / ".venv" / "bin" / name
    return str(local if local.exists() else Path(sys.executable).parent / name)


def run(words: list[str], cwd: Path, timeout: float = 120) -> str:
    """Run a doc command in `cwd`: an `asyncrl-*` command as its console script would (its main() with those
    arguments, a fork of the tests' warm interpreter: tests/launcher.py), anything else from .venv/bin."""
    if words[0].startswith("asyncrl-") and words[0].removeprefix("asyncrl-") in TOOLS.values():
        result = launcher.run(words[0].removeprefix("asyncrl-"), list(words[1:]), cwd=cwd, timeout=timeout)
    else:
        exe = sys.executable if words[0] == "python" else venv_bin(words[0])
        result = subprocess.run([exe, *words[1:]], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{shlex.join(words)} -> {result.returncode}\n{result.stderr[-2000:]}"
    return result.stdout


def code_block_after(doc: str, marker: str, lang: str) -> str:
    """The first ```lang block after the line containing `marker` in `doc`."""
    text = (ROOT / doc).read_text()
    start = text.index(marker)
    block = re.compile(rf"^```{lang}\n(.*?)^```", re.S | re.M).search(text, start)
    assert block, f"{doc}: no ```{lang} block after {marker!r}"
    return block.group(1)


def test_readme_first_run_plot_video_and_exports(tmp_path: Path) -> None:
    train = find("README.md", "asyncrl-train --env CartPole-v1 --frames 300000")
    run(budgeted(list(train.words)), tmp_path)
    assert (tmp_path / "train_dir" / "CartPole-v1" / "metrics.jsonl").stat().st_size > 0
    run(list(find("README.md", "asyncrl-plot").words), tmp_path)
    run([*find("README.md", "asyncrl-enjoy").words, "--episodes", "1"], tmp_path)
    assert (tmp_path / "cartpole.gif").stat().st_size > 0
    for fmt in ("torchscript", "onnx"):
        export = find("docs/tools.md", f"asyncrl-export train_dir/CartPole-v1 --format {fmt}")
        run(list(export.words), tmp_path)
        assert (tmp_path / export.words[-1]).stat().st_size > 0


def test_custom_env_recipe_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(code_block_after("docs/custom-envs.md", "## A custom env, end to end",
                                                         "python"))
    train = find("docs/custom-envs.md", "asyncrl-train --env my_env:Walk --env-kwargs '{\"goal\": 5}'")
    run(budgeted(list(train.words)), tmp_path)
    assert list((tmp_path / "train_dir").glob("*/checkpoints/*.pt"))


def test_sac_recipe_runs_and_updates(tmp_path: Path) -> None:
    sac = find("docs/off-policy.md", "asyncrl-train --env Pendulum-v1 --algo sac")
    run([*budgeted(list(sac.words), "400"), "--learning-starts", "200", "--report-interval", "1"], tmp_path)
    assert list((tmp_path / "train_dir" / "Pendulum-v1" / "checkpoints").glob("*.pt"))


def test_sweep_file_dry_run(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text(code_block_after("docs/tools.md", "## asyncrl-sweep", "yaml"))
    out = run(list(find("docs/tools.md", "asyncrl-sweep sweep.yaml --dry-run").words), tmp_path)
    assert out.count("asyncrl-train") >= 6, out
