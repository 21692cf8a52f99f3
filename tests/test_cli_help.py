"""`asyncrl-train --help` lists each flag once, under the heading of the algorithms it applies to."""

from __future__ import annotations

import dataclasses
import re

from asyncrl.config import ALGOS, PPO_ONLY, REPLAY_ONLY, Config, applies_to
from asyncrl.resolve import build_parser, help_group_title, help_groups

CLI_FIELDS = [f for f in dataclasses.fields(Config) if f.metadata.get("cli", True)]


def _flag(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def _sections(text: str) -> dict[str, list[str]]:
    """Heading -> the flags introduced under it (a flag's own line starts with two spaces and --)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and (m := re.match(r"  (?:-h, )?(--[a-z0-9-]+)", line)):
            current.append(m.group(1))
    return sections


def _help() -> str:
    return build_parser().format_help()


def test_every_flag_appears_exactly_once() -> None:
    flags = [flag for section in _sections(_help()).values() for flag in section]
    for f in CLI_FIELDS:
        assert flags.count(_flag(f)) == 1, f.name
    assert "--lr-base" not in flags  # recorded in config.json, not given
    assert sorted(flags) == sorted([_flag(f) for f in CLI_FIELDS] + ["--help", "--config", "--print-config"])


def test_each_algorithms_flags_are_under_its_heading() -> None:
    sections = _sections(_help())
    assert "APPO (--algo appo)" in sections and "--vtrace-c" in sections["APPO (--algo appo)"]
    off_policy = "off-policy: SAC, TD3, REDQ (--algo sac, td3, redq)"
    assert off_policy in sections and "--replay-size" in sections[off_policy]
    assert "--exploration-noise" in sections["TD3 (--algo td3)"]
    general = sections[help_group_title(ALGOS)]
    assert "--env" in general and "--frames" in general and "--eval-every" in general
    for f in CLI_FIELDS:
        assert _flag(f) in sections[help_group_title(applies_to(f))], f.name


def test_the_groups_are_the_applicability_table() -> None:
    groups = help_groups()
    assert groups[0] == ALGOS  # the settings of every algorithm come first
    assert set(groups) == {applies_to(f) for f in CLI_FIELDS}
    assert PPO_ONLY in groups and REPLAY_ONLY in groups
    headings = [help_group_title(algos) for algos in groups]
    assert len(set(headings)) == len(headings)
    sections = _sections(_help())
    assert list(sections) == ["options", *headings]  # argparse's own section (--help, --config, --print-config)
    for algos, heading in zip(groups, headings):
        assert sections[heading] == [_flag(f) for f in CLI_FIELDS if applies_to(f) == algos]
