"""Regenerate the flag tables of docs/flags.md from `asyncrl.config.Config`.

    .venv/bin/python scripts/config_table.py           # print the tables
    .venv/bin/python scripts/config_table.py --write   # replace them in docs/flags.md
    .venv/bin/python scripts/config_table.py --check   # exit 1 if the committed tables are out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

from asyncrl.config import ALGOS, Config, applies_to

DOC = Path(__file__).resolve().parent.parent / "docs" / "flags.md"
BEGIN, END = "<!-- flags:begin (scripts/config_table.py --write) -->", "<!-- flags:end -->"
SPECIAL_DEFAULTS = {"workers": "2 x CPU cores", "envs_per_worker": "0 (auto)"}


def sections() -> list[tuple[str, list[dataclasses.Field]]]:
    """Fields grouped by the `# --- name ---` comments in Config's source, in declaration order."""
    source = inspect.getsource(Config)
    fields = {f.name: f for f in dataclasses.fields(Config) if f.metadata.get("cli", True)}
    groups: list[tuple[str, list[dataclasses.Field]]] = [("general", [])]
    for line in source.splitlines():
        heading = re.match(r"\s*# --- (.+) ---", line)
        if heading:
            groups.append((heading.group(1), []))
            continue
        name = re.match(r"\s*(\w+): [\w\[\]| ]+ = (?:field|ppo_setting)\(", line)
        if name and name.group(1) in fields:
            groups[-1][1].append(fields.pop(name.group(1)))
    if fields:  # declared in a way the pattern above does not see
        groups.append(("other", list(fields.values())))
    return [(title, group) for title, group in groups if group]


def flag(f: dataclasses.Field) -> str:
    name = "--" + f.name.replace("_", "-")
    default = Config.__dataclass_fields__[f.name].default
    return f"`{name}` / `--no-{name[2:]}`" if isinstance(default, bool) else f"`{name}`"


def default_text(f: dataclasses.Field) -> str:
    if f.name in SPECIAL_DEFAULTS:
        return SPECIAL_DEFAULTS[f.name]
    value = f.default
    return "`\"\"`" if value == "" else f"`{value}`"


def algos_text(f: dataclasses.Field) -> str:
    """The --algo values a flag applies to ("all" for every algorithm)."""
    algos = applies_to(f)
    return "all" if algos == ALGOS else ", ".join(algos)


def escape(text: str) -> str:
    """Markdown-safe table cell: `<game>` must not read as an HTML tag, `|` must not split the cell."""
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "/")


def tables() -> str:
    out = []
    for title, group in sections():
        out += [f"## {title.capitalize()}", "", "| flag | default | --algo | meaning |",
                "| --- | --- | --- | --- |"]
        out += [f"| {flag(f)} | {default_text(f)} | {algos_text(f)} | {escape(f.metadata.get('help', ''))} |"
                for f in group]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="update docs/flags.md in place")
    mode.add_argument("--check", action="store_true", help="fail if docs/flags.md is out of date")
    args = parser.parse_args()
    generated = tables()
    if not (args.write or args.check):
        print(generated, end="")
        return 0
    doc = DOC.read_text()
    start, stop = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    updated = doc[:start] + "\n" + generated + doc[stop:]
    if args.check:
        if updated != doc:
            print(f"{DOC} is out of date: run scripts/config_table.py --write", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
