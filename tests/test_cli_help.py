"""`asyncrl-train --help` lists each flag once: the settings of every --algo under the task they serve, each
algorithm's own under the heading of the algorithms they apply to; then a few examples."""

from __future__ import annotations

import dataclasses
import re

import pytest

from asyncrl import __version__
from asyncrl.config import ALGOS, PPO_ONLY, REPLAY_ONLY, Config, applies_to
from asyncrl.resolve import OTHER_TASK, TASKS, build_parser, help_group_title, help_groups, task_of

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
    assert sorted(flags) == sorted([_flag(f) for f in CLI_FIELDS] + ["--help", "--version", "--config",
                                                                     "--print-config"])


def test_each_algorithms_flags_are_under_its_heading() -> None:
    sections = _sections(_help())
    assert "APPO (--algo appo)" in sections and "--vtrace-c" in sections["APPO (--algo appo)"]
    off_policy = "off-policy: SAC, TD3, REDQ (--algo sac, td3, redq)"
    assert off_policy in sections and "--replay-size" in sections[off_policy]
    assert "--exploration-noise" in sections["TD3 (--algo td3)"]
    for f in CLI_FIELDS:
        heading = task_of(f.name) if applies_to(f) == ALGOS else help_group_title(applies_to(f))
        assert _flag(f) in sections[heading], f.name


def test_the_settings_of_every_algorithm_are_grouped_by_task() -> None:
    """What a newcomer looks for first (--env, --frames, --seed) in the first sections, not among 91 flags."""
    sections = _sections(_help())
    assert sections["what to train"][:2] == ["--env", "--env-kwargs"] and "--algo" in sections["what to train"]
    assert {"--frames", "--seconds", "--seed", "--resume"} <= set(sections["how long, and where the run goes"])
    assert "--workers" in sections["speed: processes, envs and devices"]
    assert "--eval-every" in sections["evaluation, checkpoints and logging"]
    assert OTHER_TASK not in sections  # every setting of every --algo has a task
    assert all(task_of(name) != OTHER_TASK for names in TASKS.values() for name in names)


def test_the_groups_are_the_applicability_table() -> None:
    groups = help_groups()
    assert groups[0] == ALGOS  # the settings of every algorithm come first (by task)
    assert set(groups) == {applies_to(f) for f in CLI_FIELDS}
    assert PPO_ONLY in groups and REPLAY_ONLY in groups
    headings = [help_group_title(algos) for algos in groups[1:]]
    assert len(set(headings)) == len(headings)
    sections = _sections(_help())
    # argparse's own section (--help, --version, --config, --print-config), the tasks, the algorithms, examples
    assert list(sections) == ["options", *TASKS, *headings, "examples"]
    for algos, heading in zip(groups[1:], headings):
        assert sections[heading] == [_flag(f) for f in CLI_FIELDS if applies_to(f) == algos]


def test_help_is_short_of_blanks_and_has_examples_and_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help()
    assert "(default: )" not in text and "experiment name (default: the env name)" in text
    assert "usage: asyncrl-train --env ENV" in text and "--frames 1e6" in text.split("examples:")[1]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"asyncrl-train {__version__}\n"
