"""The committed docs stay true to the code: every flag documented with its default, README starts with the commands."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from asyncrl.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_flags_doc_lists_every_flag() -> None:
    doc = (ROOT / "docs" / "flags.md").read_text()
    flags = [f for f in dataclasses.fields(Config) if f.metadata.get("cli", True)]  # lr_base is recorded, not given
    missing = [f.name for f in flags if f"`--{f.name.replace('_', '-')}`" not in doc]
    assert not missing, f"docs/flags.md lacks {missing}: run scripts/config_table.py --write"


def test_configuration_tables_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_readme_starts_with_the_two_commands_and_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in readme.split("```")[1].splitlines()[1:] if line.strip()]
    assert commands == ["make train", "make test"]
    for doc in ("docs/architecture.md", "docs/configuration.md"):
        assert doc in readme and (ROOT / doc).exists()


def test_make_targets_named_in_the_readme_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "\ntrain:" in makefile and "\ntest:" in makefile
    ci = ROOT / ".ci" / "run"
    assert ci.exists() and "make test" in ci.read_text()


def test_presets_table_is_up_to_date() -> None:
    """docs/presets.md is scripts/preset_table.py's output from the code's preset definitions."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "preset_table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"^ *```.*?^ *```", "", path.read_text(), flags=re.S | re.M)  # a `# comment` in a block is no heading
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_links_between_pages_resolve() -> None:
    """Every relative link of README, CONTRIBUTING and the docs (notes too) names a file that exists, and a heading
    of it where it names one."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs" / "notes").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_user_pages_do_not_cite_issues() -> None:
    """Readers cannot see the tracker: a page says what it means instead of "the issue"."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notes").glob("*.md"))]
    citing = [f"{p.relative_to(ROOT)}:{i}" for p in pages for i, line in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"\b(the|this|that|an?) (\w+ )?issue\b|issue \d+", line, re.I)]
    assert not citing, citing
