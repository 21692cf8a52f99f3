"""The shell commands of README.md and docs/*.md: ```bash blocks and the `$ ` lines of ```console blocks.

Shared by tests/test_doc_commands.py (every command parsed and validated) and tests/test_doc_recipes*.py (every
command run, in its doc's order, with a tiny budget).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the user pages, then the measurement notes (docs/notes/: how the figures were reached, with their commands)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notes").glob("*.md"))]
FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)  # also inside list items

# (pattern searched in the command, why it is not run here): shown as the skip reason of each such command.
SKIPS: list[tuple[str, str]] = [
    (r"^make (train|test)\b", "hours (Pong) or the whole suite; the coordinator runs make test"),
    (r"^make bench\b", "the benchmark suite takes 5-25 min"),
    (r"^make peers\b", "builds two venvs from the network; tests/test_time_to_score.py runs scripts/peer_venvs.py "
                       "--dry-run"),
    (r"^(\.venv/bin/)?pip (install|wheel)", "installs from the network (tests/test_packaging.py builds the wheel)"),
    (r"^make install\b", "installs into .venv, the venv these tests run from"),
    (r"^source ", "changes the calling shell"),
    (r"^tensorboard ", "a server that runs until stopped"),
    (r"^scripts/soak\.sh", "a soak run of minutes to hours"),
    (r"^scripts/(fetch_gpu_wheels|gpu_check)\.sh", "the CUDA check's scripts: run on a GPU machine"),
    (r"^python benchmarks/envpool_vs_gym\.py", "an env-only benchmark of minutes, not a recipe"),
    (r"^asyncrl-sweep sweep\.yaml --concurrent", "six training runs; the --dry-run line beside it runs here"),
    (r"^(\.venv/bin/python |python )?examples/", "an example: tests/test_examples.py runs each with a tiny budget"),
    (r"^ray start\b", "starts a Ray node that runs until stopped; tests/test_remote_actors.py starts a cluster"),
    (r"^asyncrl-train .*--ray \d", "needs a Ray cluster at that address; tests/test_remote_actors.py trains on one"),
    (r"^asyncrl-tune\b", "a search of minutes; tests/test_tune.py runs the tuner on two layouts"),
    (r"--config tuned-\S+\.yaml", "trains with a file asyncrl-tune wrote; tests/test_tune.py runs one"),
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
    if first in ("python", ".venv/bin/python") and command.words[1].startswith(("scripts/", "benchmarks/")):
        return "script"
    if first in ("python", ".venv/bin/python") and command.words[1] == "-c":
        return "inline"
    return "unclassified"


def has_seed_placeholder(words: tuple[str, ...] | list[str]) -> bool:
    """Whether the command stands for several seeds: `--seed S`, `--experiment seedS`."""
    return any(w == "S" or re.search(r"seedS\b", w) for w in words)


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


def find(doc: str, prefix: str) -> DocCommand:
    """The command of docs file `doc` that starts with `prefix` (the test fails when a doc drops it)."""
    matches = [c for c in COMMANDS if c.where.startswith(doc + ":") and c.text.startswith(prefix)]
    assert matches, f"{doc} no longer has a command starting with {prefix!r}"
    return matches[0]


def code_block_after(doc: str, marker: str, lang: str) -> str:
    """The first ```lang block after the line containing `marker` in `doc`."""
    text = (ROOT / doc).read_text()
    start = text.index(marker)
    block = re.compile(rf"^```{lang}\n(.*?)^```", re.S | re.M).search(text, start)
    assert block, f"{doc}: no ```{lang} block after {marker!r}"
    return block.group(1)
