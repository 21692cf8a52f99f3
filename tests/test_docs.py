"""The committed docs stay true to the code: every flag documented with its default, README starts with the commands."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from asyncrl.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_configuration_doc_lists_every_flag() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    flags = [f for f in dataclasses.fields(Config) if f.metadata.get("cli", True)]  # lr_base is recorded, not given
    missing = [f.name for f in flags if f"`--{f.name.replace('_', '-')}`" not in doc]
    assert not missing, f"docs/configuration.md lacks {missing}: run scripts/config_table.py --write"


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
