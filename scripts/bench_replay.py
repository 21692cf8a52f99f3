"""Replay throughput alone, as a markdown table: `asyncrl-bench --mode replay` (asyncrl/bench/replay.py).

    .venv/bin/python scripts/bench_replay.py                         # capacity 1M, each buffer filled to 1 GiB
    .venv/bin/python scripts/bench_replay.py --replay-fill-gib 0.2   # touch less memory (capacity stays 1M)

Takes asyncrl-bench's flags (--replay-capacity, --replay-fill-gib, --seconds, --repeats). `make bench` runs the
same measurement as the suite's `replay` step.
"""

from __future__ import annotations

import sys

from asyncrl.bench.replay import run_replay
from asyncrl.bench.report import replay_table
from asyncrl.cli.bench import build_parser, settings_from


def main() -> None:
    args = build_parser().parse_args(["--mode", "replay", *sys.argv[1:]])
    print("\n".join(replay_table([run_replay(settings_from(args, []))])))


if __name__ == "__main__":
    main()
