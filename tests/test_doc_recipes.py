"""Every command of README.md and docs/*.md runs as written, in its doc's order, with a tiny budget.

How each kind of command is run and made short: tests/doc_session.py. The docs here run one after another (README
first) in one directory, as in a checkout, so a later doc's commands may read the runs an earlier one made; those
in `STANDALONE` need none and run in tests/test_doc_recipes_standalone.py, beside these.
"""

from __future__ import annotations

import pytest

from tests.doc_commands import COMMANDS, DocCommand
from tests.doc_session import DOCS_WITH_COMMANDS, RUNNABLE, STANDALONE, DocSession, kind, not_here, run_doc


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> DocSession:
    """One checkout's directory for these docs, README first: a later doc may use what README's first run made."""
    return DocSession(tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("doc", [d for d in DOCS_WITH_COMMANDS if d not in STANDALONE])
def test_doc_commands_run_in_order(doc: str, session: DocSession) -> None:
    run_doc(session, doc)


@pytest.mark.parametrize("command", [pytest.param(c, id=c.where) for c in COMMANDS
                                     if kind(c) in RUNNABLE and not_here(c)])
def test_command_not_run_here(command: DocCommand) -> None:
    pytest.skip(f"{command.text[:60]}: {not_here(command)}")
