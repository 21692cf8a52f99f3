"""The docs of tests/doc_session.py's `STANDALONE` (results.md) run as written, each in a directory of its own.

A file of its own so that pytest-xdist (`--dist loadfile`) runs it beside tests/test_doc_recipes.py's docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_session import DOCS_WITH_COMMANDS, STANDALONE, DocSession, run_doc


@pytest.mark.parametrize("doc", [d for d in STANDALONE if d in DOCS_WITH_COMMANDS])
def test_doc_commands_run_in_order(doc: str, tmp_path: Path) -> None:
    run_doc(DocSession(tmp_path), doc)
