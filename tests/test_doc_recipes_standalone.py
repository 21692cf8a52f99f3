"""The docs of tests/doc_session.py's `STANDALONE` (results.md and the notes of results) run as written, in order, in
one directory of their own (a later one finds the runs an earlier one made, as when they were one page).

A file of its own so that pytest-xdist (`--dist loadfile`) runs it beside tests/test_doc_recipes.py's docs."""

from __future__ import annotations

import pytest

from tests.doc_session import DOCS_WITH_COMMANDS, STANDALONE, DocSession, run_doc


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> DocSession:
    return DocSession(tmp_path_factory.mktemp("standalone"))


@pytest.mark.parametrize("doc", [d for d in STANDALONE if d in DOCS_WITH_COMMANDS])
def test_doc_commands_run_in_order(doc: str, session: DocSession) -> None:
    run_doc(session, doc)
