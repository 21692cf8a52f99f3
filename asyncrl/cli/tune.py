"""`asyncrl-tune`: measure a few process layouts for one env and algorithm on this machine, keep the fastest.

    asyncrl-tune --env atari_pong --budget 120 --out pong.yaml
    asyncrl-train --config pong.yaml --frames 1e7

Every flag that is not the tuner's own is an asyncrl-train flag: it sets what is trained (--env, --algo,
--env-kwargs, --hidden-size, ...) and is kept in the output file. Layout flags given (--workers, --envs-per-worker,
--worker-splits, --policy-workers, --batch-size, --minibatches, --learner-threads) are the start layout; without
them the start is the preset's. Each layout runs the real engine for --seconds-per-layout in a child process
(asyncrl.tune.measure); which layout comes next depends on the bottleneck verdict of the fastest so far
(asyncrl.tune.search, asyncrl.diagnostics.layout_moves). The winner is written as a --config file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from asyncrl.cli.errors import OneLineParser, fail
from asyncrl.cli.train import main as train_main
from asyncrl.config import PPO_ONLY, Config, ConfigError
from asyncrl.diagnostics.bottleneck import LABELS
from asyncrl.diagnostics.layout_moves import LAYOUT, Reference, layout_of, layout_text
from asyncrl.envs.base import EnvError
from asyncrl.system import affinity_cpus, cgroup_cpu_limit, usable_cpus
from asyncrl.tune.measure import measure
from asyncrl.tune.search import START_UP_S, Search, Trial

# Set by the tuner for its measurements (or meaningless for them); refused on its command line.
MEASUREMENT_FLAGS = ("seconds", "train_dir", "experiment", "report_interval", "checkpoint_interval",
                     "keep_checkpoints", "dashboard", "resume")
NOT_TUNABLE = ("serial", "deterministic")  # one process or one worker: there is no layout to tune
TRAIN_FLAGS_NOTE = "every other flag is asyncrl-train's (asyncrl-train --help) and is kept in the output file"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="asyncrl-tune", description=__doc__.split("\n\n")[0], allow_abbrev=False,  # --seconds is asyncrl-train's
        usage="%(prog)s --env ENV [--algo ALGO] [--budget S] [--seconds-per-layout S] [--out FILE] "
              "[asyncrl-train flags]",
        epilog=f"{TRAIN_FLAGS_NOTE}; docs/performance.md shows tables for Pong, CartPole, doom_basic and "
               "HalfCheetah SAC.")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="seconds the whole search may take, start-up of every run included (default: 120)")
    parser.add_argument("--seconds-per-layout", type=float, default=8.0,
                        help="--seconds of each measured run; the first 2-4 s of each are start-up (default: 8)")
    parser.add_argument("--max-layouts", type=int, default=0,
                        help="measure at most this many layouts (default 0: as many as the budget holds)")
    parser.add_argument("--out", default="",
                        help="the --config file the winner is written to (default: tuned-ENV.yaml)")
    parser.add_argument("--no-confirm", dest="confirm", action="store_false",
                        help="skip measuring the start and the winner a second time at the end")
    parser.add_argument("--keep-runs", default="", metavar="DIR",
                        help="write the measured runs under DIR and keep them (default: a temporary directory, "
                             "removed)")
    return parser


def explicit_flags(words: list[str]) -> dict[str, Any]:
    """The asyncrl-train settings `words` give (their --config file's, then theirs), as Config fields."""
    from asyncrl.resolve import _given, read_config_file
    from asyncrl.resolve import build_parser as train_parser

    parser = train_parser("asyncrl-tune")
    args = vars(parser.parse_args(words))
    config_file = args.pop("config")
    args.pop("print_config")
    given = {k: v for k, v in args.items() if v != parser.get_default(k) or _given(k, words)}
    return {**(read_config_file(config_file) if config_file else {}), **given}


def as_flags(settings: dict[str, Any]) -> list[str]:
    """Config fields as asyncrl-train's command line."""
    out = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def layout_settings(cfg: Config) -> dict[str, Any]:
    return {k: v for k, v in layout_of(cfg).items() if k in LAYOUT}


def cores_line(cores: int) -> str:
    """`2 usable cores (affinity 2 of 2; no cgroup quota)`."""
    quota = cgroup_cpu_limit()
    return (f"{cores} usable core{'s' if cores != 1 else ''} (affinity {affinity_cpus()} of {os.cpu_count()}; "
            f"{'no cgroup CPU quota' if quota is None else f'cgroup quota {quota:g} cores'})")


def row(trial: Trial) -> str:
    """One line of the table."""
    r = trial.result
    if r.error:
        return f"{trial.number:>3}  {layout_text(trial.layout):<34} {'failed':>9}  {r.error}"
    again = f" ({', '.join(f'{x.score:,.0f}' for x in trial.results[1:])} again)" if len(trial.results) > 1 else ""
    dropped = f"{r.dropped_share:.0%}" if r.dropped_share > 0 else "0"
    verdict = LABELS.get(r.verdict or "", "-")
    return (f"{trial.number:>3}  {layout_text(trial.layout):<34} {r.score:>9,.0f} {dropped:>5}  {verdict:<18} "
            f"{trial.why}{again}")


HEADER = (f"{'#':>3}  {'layout (workers x envs/splits, policy w., batch/mb, threads)':<34} {'steps/s':>9} "
          f"{'drop':>5}  {'verdict':<18} why measured")


def write_config(path: str, settings: dict[str, Any], lines: list[str]) -> None:
    """The winner as a YAML --config file, the tuner's table above it as comments."""
    import yaml

    text = "".join(f"# {line}\n" for line in lines) + yaml.safe_dump(settings, sort_keys=False)
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    opts, train_words = parser.parse_known_args(words)
    try:
        given = explicit_flags(train_words)
        for name in MEASUREMENT_FLAGS + NOT_TUNABLE:
            if name in given and (name not in NOT_TUNABLE or given[name]):
                return fail("tune", f"--{name.replace('_', '-')} is not for asyncrl-tune (it runs each layout "
                                    f"itself{', the forked engine' if name in NOT_TUNABLE else ''}); drop it")
        from asyncrl.resolve import config_from_flags

        start = config_from_flags(**given)
        start.validate()
        preset = config_from_flags(**{k: v for k, v in given.items() if k not in LAYOUT})
    except (ConfigError, EnvError) as exc:
        return fail("tune", str(exc))
    if opts.seconds_per_layout < 3 or opts.budget < opts.seconds_per_layout:
        return fail("tune", "--seconds-per-layout must be at least 3 and --budget at least that")
    cores = usable_cpus()
    ref = Reference.of(start)
    ref = dataclasses.replace(ref, envs_per_worker=max(ref.envs_per_worker, preset.envs_per_worker))
    base = {k: v for k, v in given.items() if k not in LAYOUT}
    measuring = {"learning_starts": start.batch_size} if start.algo not in PPO_ONLY else {}
    out_path = opts.out or f"tuned-{start.env.replace(':', '_').replace('/', '_')}.yaml"
    run_dir = opts.keep_runs or tempfile.mkdtemp(prefix="asyncrl-tune-")

    def run_layout(cfg: Config, name: str):
        return measure(train_main, as_flags({**base, **measuring, **layout_settings(cfg)}), opts.seconds_per_layout,
                       run_dir, name)

    warned: list[str] = []

    def on_trial(trial: Trial) -> None:
        print(row(trial), flush=True)
        if trial.result.verdict == "starved" and not warned:
            warned.append("starved")
            print("asyncrl-tune: warning: other jobs hold the cores (a CPU-starved verdict): these figures are this "
                  "busy machine's and vary run to run; tune again when it is quiet", flush=True)

    search = Search(start, ref, cores, opts.seconds_per_layout, opts.budget, run_layout,
                    max_layouts=opts.max_layouts, confirm=opts.confirm, on_trial=on_trial)
    whose = "your layout" if any(k in given for k in LAYOUT) else "the preset's layout"
    print(f"asyncrl-tune: {start.env} ({start.algo}) on {cores_line(cores)}; start: {whose}, "
          f"{layout_text(layout_of(start))}", flush=True)
    print(f"asyncrl-tune: up to {search.planned_layouts()} layouts of {opts.seconds_per_layout:g} s each "
          f"(about {opts.seconds_per_layout + START_UP_S:.0f} s with start-up)"
          f"{', then the start and the winner again' if opts.confirm else ''}: at most {opts.budget:.0f} s "
          f"in all, ending by {time.strftime('%H:%M:%S', time.localtime(time.time() + opts.budget))}", flush=True)
    print(HEADER, flush=True)
    t0 = time.monotonic()
    try:
        winner = search.run()
    except KeyboardInterrupt:
        print("asyncrl-tune: interrupted; no file written", file=sys.stderr)
        return 130
    finally:
        if not opts.keep_runs:
            with contextlib.suppress(OSError):
                shutil.rmtree(run_dir)
    elapsed = time.monotonic() - t0
    if not winner.ok:
        return fail("tune", f"no layout ran ({winner.result.error})")
    lines = ["", HEADER, *(row(t) for t in search.trials)] if search.confirmed else []
    for line in lines:
        print(line)
    ratio = search.ratio()
    times = "means of two runs each" if search.confirmed else "one run each"
    summary = (f"winner #{winner.number}: {layout_text(winner.layout)}, {winner.score:,.0f} steps/s"
               + ("" if ratio is None else f" = {ratio:.2f}x the start's ({whose}; {times})")
               + f"; {len(search.trials)} layouts in {elapsed:.0f} s")
    print(f"asyncrl-tune: {summary}")
    settings = {**base, **layout_settings(winner.config)}
    if "learner_threads" in settings and not settings["learner_threads"]:
        settings.pop("learner_threads")  # 0 is the default (auto)
    header = [f"asyncrl-tune on {cores_line(cores)}, {time.strftime('%Y-%m-%d %H:%M')}", summary, "",
              HEADER, *(row(t) for t in search.trials), "",
              f"asyncrl-train --config {os.path.basename(out_path)} --frames N"]
    try:
        write_config(out_path, settings, header)
    except OSError as exc:
        return fail("tune", f"cannot write {out_path} ({exc.strerror or exc})")
    print(f"asyncrl-tune: wrote {out_path}: asyncrl-train --config {out_path} [--frames N]")
    return 0


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
