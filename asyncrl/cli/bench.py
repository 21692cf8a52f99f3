"""`asyncrl-bench`: the throughput suite (markdown on stdout, records in bench/results.json), or one mode alone
(one JSON record on stdout)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import Any

from asyncrl.bench.settings import (
    BATCHED_ENVS,
    MODES,
    NAIVE_ENVS,
    REF_BATCH,
    REF_ENVS_PER_WORKER,
    REF_ROLLOUT,
    REF_WORKERS,
    REPLAY_CAPACITY,
    REPLAY_FILL_GIB,
    REPLAY_SECONDS,
    TRAINER_MODES,
    BenchSettings,
)
from asyncrl.cli.errors import OneLineParser

DESCRIPTION = """Measure asyncrl's throughput (agent steps/s and frames/s) on this machine.

Without --mode: the full suite (under 25 min on 2 cores) or --quick (about 5 min): atari_pong (Nature CNN)
and CartPole-v1 (MLP) in modes env_only, sampler, train and naive, plus null and replay; with vizdoom
installed, also doom_basic and doom_deathmatch_bots in env_only, sampler and train. The full suite adds sampler
scaling from 1 to 2 x cores workers. Prints markdown tables and writes the records to --out.

Modes:
""" + "\n".join(textwrap.fill(text, 110, initial_indent=f"  {name:10s}", subsequent_indent=" " * 12)
             for name, text in MODES.items()) + """

Flags after `--` go to asyncrl-train in the sampler, train and null modes, e.g. `-- --learner-threads 2`, and
to Sample Factory in mode sf2_train alone, e.g. `-- --use_rnn=False`.

Each figure is the median of --repeats windows of --seconds/--repeats s after one warm-up window. For sampler,
train and null the windows are consecutive metrics.jsonl records of one asyncrl-train run with
--report-interval equal to the window; env_only and naive time their windows themselves.
"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="asyncrl-bench", description=DESCRIPTION,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=list(MODES), help="run one mode alone and print one JSON record")
    p.add_argument("--env", help="env name (one mode: default atari_pong; suite: only this env)")
    p.add_argument("--quick", action="store_true", help="the short suite (3 windows of 3 s per figure, 5 s for train)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"rollout workers, or env_only processes (default {REF_WORKERS}); naive: env processes "
                        f"(default {NAIVE_ENVS}); naive_vector: envs in its VectorEnv (default {BATCHED_ENVS})")
    p.add_argument("--envs-per-worker", type=int, default=REF_ENVS_PER_WORKER,
                   help=f"envs per worker, in 2 splits (default {REF_ENVS_PER_WORKER})")
    p.add_argument("--rollout", type=int, default=REF_ROLLOUT, help=f"trajectory length (default {REF_ROLLOUT})")
    p.add_argument("--batch-size", type=int, default=REF_BATCH, help=f"samples per update (default {REF_BATCH})")
    p.add_argument("--minibatches", type=int, default=BenchSettings.minibatches,
                   help=f"optimizer steps per epoch (default {BenchSettings.minibatches}, as asyncrl-train)")
    p.add_argument("--epochs", type=int, default=1, help="passes over each batch (default 1)")
    p.add_argument("--hidden-size", type=int, default=64, help="MLP width for vector observations (default 64)")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per figure, after one warm-up window (default: one mode 15, replay 5; "
                        "--quick 9, or 15 for train, 0.9 for replay; full suite 40, 5 for replay)")
    p.add_argument("--repeats", type=int, default=None, help="windows per figure, at least 3 (default 3; full: 5)")
    p.add_argument("--replay-capacity", type=int, default=REPLAY_CAPACITY,
                   help=f"replay mode: buffer capacity in transitions (default {REPLAY_CAPACITY:,})")
    p.add_argument("--replay-fill-gib", type=float, default=None,
                   help=f"replay mode: memory each buffer may touch when first filled (default {REPLAY_FILL_GIB:g}; "
                        "--quick suite 0.05)")
    p.add_argument("--sf2-python", default="", metavar="PATH",
                   help="a Python with sample-factory and vizdoom (its own venv): the suite then also runs "
                        "Sample Factory 2 training each doom_ env (mode sf2_train)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the models run, the same for asyncrl, the naive loop and Sample Factory so that "
                        "their rows compare like with like; each record names its device (default auto: cuda "
                        "when present)")
    p.add_argument("--out", default=os.path.join("bench", "results.json"), help="suite records (JSON list)")
    return p


def settings_from(args: argparse.Namespace, trainer_args: list[str]) -> BenchSettings:
    mode = args.mode or "sampler"
    return BenchSettings(
        env=args.env or "atari_pong", mode=mode,
        workers=args.workers or {"naive": NAIVE_ENVS, "naive_vector": BATCHED_ENVS}.get(mode, REF_WORKERS),
        envs_per_worker=args.envs_per_worker, rollout=args.rollout, batch_size=args.batch_size,
        minibatches=args.minibatches, epochs=args.epochs, hidden_size=args.hidden_size,
        seconds=args.seconds or (REPLAY_SECONDS if mode == "replay" else 15.0), repeats=args.repeats or 3,
        extra_trainer_args=tuple(trainer_args), sf2_python=args.sf2_python,
        replay_capacity=args.replay_capacity, replay_fill_gib=args.replay_fill_gib or REPLAY_FILL_GIB,
        device=args.device)


def run_mode(s: BenchSettings) -> dict[str, Any]:
    """One measurement in this process; the machine is described after any workers were forked."""
    from asyncrl.bench.machine import machine_info, resolve_bench_device

    if s.mode == "env_only":
        from asyncrl.bench.env_only import run_env_only as run
    elif s.mode in ("naive", "naive_vector"):
        from asyncrl.bench.naive import run_naive as run
    elif s.mode == "replay":
        from asyncrl.bench.replay import run_replay as run
    elif s.mode == "sf2_train":
        from asyncrl.bench.sample_factory import run_sample_factory as run
    elif s.mode == "ray_train":
        from asyncrl.bench.ray_row import run_ray_train as run
    else:
        from asyncrl.bench.trainer import run_trainer as run
    record = run(s)
    if s.mode in ("env_only", "replay"):  # no model: all on the CPU
        record["device"] = "cpu"
    else:
        record["device"] = resolve_bench_device(s.trainer_device if s.mode in TRAINER_MODES else s.device)
    record["machine"] = machine_info()
    return record


def run_suite_cli(args: argparse.Namespace, base: BenchSettings) -> int:
    from asyncrl.bench.report import markdown
    from asyncrl.bench.suite import run_suite, suite_envs

    overrides = {k: v for k, v in (("seconds", args.seconds), ("repeats", args.repeats),
                                   ("replay_fill_gib", args.replay_fill_gib)) if v}
    envs, skipped = suite_envs(args.env, args.quick)
    if skipped:
        print(f"asyncrl-bench: {skipped}", file=sys.stderr, flush=True)
    records, ratios = run_suite(envs, args.quick, base, overrides)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    print(markdown(records, ratios, notes=[skipped] if skipped else []))
    print(f"records: {args.out}")
    return 1 if any(r.get("error") for r in records) else 0


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(asyncrl-bench's own flags, the asyncrl-train flags after `--`)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    own, trainer_args = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if args.quick and args.mode:
        print("asyncrl-bench: error: --quick picks the short suite and does nothing with --mode; give --seconds and "
              "--repeats instead", file=sys.stderr)
        return 2
    if args.repeats is not None and args.repeats < 3:
        print("asyncrl-bench: error: --repeats must be at least 3", file=sys.stderr)
        return 2
    if min(args.workers or 1, args.envs_per_worker, args.rollout, args.batch_size, args.replay_capacity) < 1:
        print("asyncrl-bench: error: --workers, --envs-per-worker, --rollout, --batch-size, --replay-capacity "
              "must be >= 1", file=sys.stderr)
        return 2
    if args.replay_fill_gib is not None and args.replay_fill_gib <= 0:
        print("asyncrl-bench: error: --replay-fill-gib must be > 0", file=sys.stderr)
        return 2
    if args.sf2_python and not (os.path.isfile(args.sf2_python) and os.access(args.sf2_python, os.X_OK)):
        print(f"asyncrl-bench: error: --sf2-python {args.sf2_python} is not an executable file: give the python of "
              "a venv with `pip install sample-factory vizdoom`", file=sys.stderr)
        return 2
    if args.mode == "sf2_train" and not (args.sf2_python and (args.env or "").startswith("doom_")):
        print("asyncrl-bench: error: --mode sf2_train needs --sf2-python PATH and --env doom_<scenario>",
              file=sys.stderr)
        return 2
    base = settings_from(args, trainer_args)
    if args.mode is None:
        return run_suite_cli(args, base)
    if args.mode == "null":
        base = base.for_mode("null")
    try:
        record = run_mode(base)
    except Exception as exc:  # noqa: BLE001 - one line for the user (the suite records it and goes on)
        print(f"asyncrl-bench: error: {base.env} {base.mode}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
