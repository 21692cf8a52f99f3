"""`asyncrl-train`: parse the command line (and --config FILE), validate it, run the trainer."""

from __future__ import annotations

import sys

from asyncrl.config import ConfigError
from asyncrl.envs.base import EnvError
from asyncrl.launch import ForkError, run, validate
from asyncrl.resolve import parse_command_line


def main(argv: list[str] | None = None) -> int:
    try:
        command = parse_command_line(argv)
        if command.print_config:  # the resolved settings, validated; nothing is created
            validate(command.config)
            print(command.config.to_json())
            return 0
        return run(command.config)[0]
    except (ConfigError, EnvError, ForkError) as exc:
        print(f"asyncrl-train: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
