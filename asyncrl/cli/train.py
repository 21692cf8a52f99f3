"""`asyncrl-train`: parse the command line (and --config FILE), run the preflight, run the trainer."""

from __future__ import annotations

from asyncrl.cli.errors import fail
from asyncrl.config import ConfigError
from asyncrl.envs.base import EnvError
from asyncrl.launch import ForkError, run
from asyncrl.preflight import preflight
from asyncrl.resolve import parse_command_line


def main(argv: list[str] | None = None) -> int:
    try:
        command = parse_command_line(argv)
        if command.print_config:  # the resolved settings, through the run's preflight; nothing is created
            preflight(command.config, command.resolution.specs, dry=True)
            print(command.config.to_json())
            return 0
        return run(command.resolution)[0]
    except (ConfigError, EnvError, ForkError) as exc:
        return fail("train", str(exc))


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
