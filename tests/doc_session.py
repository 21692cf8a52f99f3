"""How tests/test_doc_recipes*.py run every command of README.md and docs/*.md as written, in its doc's order,
with a tiny budget.

A DocSession is one directory, as in a checkout, in which docs run one after another: it holds the files that code
blocks name on their first line (`# my_env.py`, `# run.yaml`, `# sweep.yaml`, ...), `scripts/`, `benchmarks/` and
`tests/`. So a
recipe's plot, enjoy, export and compare commands read the runs that the training commands before them made.

* `asyncrl-train` (also under `torchrun`): `--frames` set to BUDGET, or for APPO to what its first update takes
  (`first_update_frames`), and `--seconds` dropped (the off-policy algorithms get their own budgets; SMALLER shrinks
  the 4,096-env example, SLOW_START_LAYOUT Atari and VizDoom); the run must exit 0 and save a checkpoint of a trained
  policy (version >= 2: version 1 is the first, untrained weights).
  Placeholders are filled in as tests/doc_commands.py says; a command with seed S runs for S = 0, 1 and 2. A
  command that writes where an earlier one did (README's list of alternatives) first moves that run aside.
* A command whose settings equal an earlier one's but for NOT_SHAPE (budget, seed, names, where metrics go) is not
  trained again: the earlier run directory is copied to where the command writes, so what follows finds its run.
  The settings compared are the resolved configuration (as `--print-config` shows it).
* The other console scripts and `python scripts/...` or `benchmarks/...`: as written, made shorter by SHORTER (enjoy
  plays one short episode; asyncrl-diagnose's --core-state and --shots by DIAGNOSE_SHORTER; compare's --at-frames
  cuts where every run it reads has come, `common_cut`); the files named by `--out` / `--video` must exist
  afterwards.
* A command that cannot run here is in NOT_HERE with its reason (test_command_not_run_here lists each).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import Config
from tests import launcher
from tests.doc_commands import (
    COMMANDS,
    DOCS,
    FENCE,
    ROOT,
    TOOLS,
    DocCommand,
    fill,
    has_seed_placeholder,
    kind,
    train_argv,
)

BUDGET = "600"  # --frames of every training run, raised to FIRST_UPDATE's where that is more
# enough for each of the preset's envs to end an episode that a later curve or comparison reads (on a quiet machine
# the first update's overshoot does it; under load it may not): PPO on Pendulum has 16 envs of 200 steps
# CartPole-v1: a few report intervals of 0.05 s (asyncrl-plot, which README.md runs next, draws a curve from two)
EPISODE_BUDGET = {"Pendulum-v1": "3600", "CartPole-v1": "12000"}
# --algo sac|td3|redq: a few updates after a warm-up long enough for each of the preset's Pendulum envs (8 for SAC and
# TD3, 2 for REDQ) to end its first 200-step episode (results.md's windowed returns need them); REDQ at 1 update
# per step, not its 20
OFF_POLICY_BUDGET = {"--frames": "1700", "--learning-starts": "1600"}
REDQ_BUDGET = {"--frames": "450", "--learning-starts": "400", "--utd": "1"}
RUN_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true",  # tools.md's --wandb lines: nothing leaves the machine
           # gymnax envs: unoptimised XLA compiles in half the CPU and steps the same envs (tests/test_gymnax_env.py)
           "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))}
# what a run's shape does not depend on: two commands that differ only here train the same thing
NOT_SHAPE = ("frames", "seconds", "seed", "experiment", "train_dir", "run_dir", "resume",
             "wandb_project", "wandb_group", "wandb_tags")


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def sf2_python(words: tuple[str, ...]) -> bool:
    return "--sf2-python" in words and Path(words[words.index("--sf2-python") + 1]).exists()


# (pattern in the command, why it does not run here, the condition under which it does run)
NOT_HERE: list[tuple[str, str, Callable[[tuple[str, ...]], bool]]] = [
    (r"--nnodes 2", "two hosts on one network (docs/scaling.md); the one-host torchrun line runs", lambda _: False),
    (r"--device cuda", "needs a CUDA device", lambda words: cuda()),
    (r"^asyncrl-train --env atari_pong --workers 32$",
     "tests/test_e2e.py's 32-worker Pong test runs it at the recipes' Atari layout (SLOW_START_LAYOUT) and stops it "
     "with Ctrl-C, as README says", lambda _: False),
    (r"--sf2-python", "needs Sample Factory 2 in its own venv (docs/performance.md says how)", sf2_python),
    (r"lr_sweep/\*", "reads the sweep's six 50k-frame runs; the sweep's --dry-run line runs", lambda _: False),
    (r"runs/compile_learning/", "reads scripts/compile_learning.sh's runs (3 seeds eager and compiled, minutes each)",
     lambda _: False),
    (r"scripts/check_readme_cartpole\.py",
     "README's CartPole command over 10 seeds, minutes: a reviewer runs it; tests/test_readme_claim.py checks that it "
     "runs README's command, and test_doc_commands parses its flags", lambda _: False),
    (r"^asyncrl-bench |benchmarks/bench_doom\.py|scripts/stale_share\.py",
     "a throughput measurement, kept out of the timed tests: `make bench` runs the suite, tests/test_bench.py each "
     "mode with sub-second windows, and test_doc_commands parses these flags", lambda _: False),
    (r"asyncrl-plot train_dir/pong_v3|asyncrl-compare "
     r"(pong|doom_basic|doom_my_way_home|status_bar|HalfCheetah-v5|one_policy) ",
     "reads finished episodes: within the budget no env of these runs ends one (a Pong game lost 0-21 is about "
     "800 agent steps, a HalfCheetah episode 1,000, a Doom episode up to 525, a KAZ agent's game 150-175)",
     lambda _: False),
]
# a console script's flags replaced (or added) so it finishes in seconds
SHORTER: dict[str, dict[str, str]] = {"enjoy": {"--episodes": "1", "--max-steps": "200"}}
# training commands at a scale that would take the machine from the other tests (found so in a CI run: 181 s, and
# a SAC run beside it was stopped as hung), run at a smaller one: (pattern, flags replaced)
SMALLER: list[tuple[str, dict[str, str]]] = [
    (r"--envs-per-worker 2048 ", {"--envs-per-worker": "64", "--batch-size": "2048"}),  # 4,096 envs, batches of 65,536
    # results.md's Breakout-MinAtar runs: a first batch of 8,192 steps took 13-22 s, one of 256 a few; one worker, as
    # each imports JAX and gymnax and compiles the env (2 workers: 16.5 CPU-s and 11.0 s a run; 1: 9.8 and 8.0)
    (r"--env gymnax:Breakout-MinAtar ", {"--workers": "1", "--envs-per-worker": "8", "--rollout": "16",
                                         "--batch-size": "256"}),
]
# Atari and VizDoom games are slow to start: at the presets' 4 x 16 a run took 15-18 s of CPU to its first update,
# at 2 a worker (one per split) 5 s. So runs of those envs (as resolved: `asyncrl-train --wandb` trains Pong) get
# SLOW_START_LAYOUT, one game a worker, README's main job (`make train`'s) and its --resume too (tests/test_e2e.py's
# 32-worker Pong run starts 32 Pong envs at it).
SLOW_START_ENVS = ("atari_", "doom_")
SLOW_START_LAYOUT = {"--envs-per-worker": "1", "--worker-splits": "1", "--batch-size": "256"}
# a VizDoom network match (doom_duel): its 2 env columns in one split of one worker (one match of 2 players), and a
# first batch of 64 steps (a match steps some 40 times a second per player here)
MATCH_LAYOUT = {"--workers": "1", "--envs-per-worker": "2", "--worker-splits": "1", "--rollout": "16",
                "--batch-size": "64"}
# asyncrl-diagnose's modes that play the run's policy: a few steps, one episode (an untrained Doom policy's: ~100 steps)
DIAGNOSE_SHORTER = {"--core-state": {"--steps": "50"}, "--shots": {"--episodes": "1"}}
SCRIPT_SHORTER = {"benchmarks/value_offset.py": {"--slots": "2", "--updates": "1", "--variants": "full", "--envs": "2"}}
FRAMESKIP = {"atari_": 4, "doom_": 4}  # frames per agent step (asyncrl/envs/atari.py, doom.py); 1 elsewhere


def network_match(env: str) -> bool:
    """A VizDoom scenario of several players (asyncrl/envs/doom_match.py)."""
    from asyncrl.envs.doom import DOOM_PREFIX, SCENARIOS

    return env.startswith(DOOM_PREFIX) and SCENARIOS.get(env[len(DOOM_PREFIX):], SCENARIOS["basic"]).players > 1


def first_update_frames(cfg: Config) -> int:
    """The --frames after which an APPO run has trained on its first batch: a whole batch in finished trajectories
    while every env may still be filling one more (a --frames stop trains on the whole batches collected)."""
    skip = next((n for prefix, n in FRAMESKIP.items() if cfg.env.startswith(prefix)), 1)
    return (cfg.batch_size + cfg.workers * cfg.envs_per_worker * cfg.rollout) * skip


NOTES = "docs/notes/"  # measurement histories: how a figure at a named commit was reached


def not_here(command: DocCommand) -> str | None:
    if command.where.startswith(NOTES):  # the user pages' commands run; a note's flags are still validated
        return ("a measurement note's command (how a figure at its commit was reached): test_doc_commands.py "
                "validates its flags, the user pages' commands run here")
    for pattern, reason, runs_when in NOT_HERE:
        if re.search(pattern, command.text) and not runs_when(command.words):
            return reason
    return None


def companion_files() -> dict[str, str]:
    """Code blocks whose first line names a file (`# my_env.py`), by that name."""
    files = {}
    for path in DOCS:
        for block in FENCE.finditer(path.read_text()):
            body = textwrap.dedent(block.group(2))
            named = re.match(r"# ([\w/.-]+\.(?:py|ya?ml|json))\b", body)
            if named:
                files[named.group(1)] = body
    return files


def replaced(words: list[str], values: dict[str, str], drop: tuple[str, ...] = ()) -> list[str]:
    """`words` with each flag of `values` set to its value (added when absent) and the flags in `drop` removed."""
    out, i = [], 0
    while i < len(words):
        if words[i] in values or words[i] in drop:
            i += 2
            continue
        out.append(words[i])
        i += 1
    return out + [w for flag, value in values.items() for w in (flag, value)]


def budgeted(argv: list[str]) -> list[str]:
    if "--help" in argv:
        return argv
    algo = argv[argv.index("--algo") + 1] if "--algo" in argv else ""
    env = argv[argv.index("--env") + 1] if "--env" in argv else ""
    values = {"sac": OFF_POLICY_BUDGET, "td3": OFF_POLICY_BUDGET, "redq": REDQ_BUDGET}.get(
        algo, {"--frames": EPISODE_BUDGET.get(env, BUDGET)})
    return replaced(argv, values, drop=("--seconds",))


def resolved(argv: list[str], cwd: Path) -> Config:
    """The run's settings, resolved in `cwd` as the run would."""
    from asyncrl.resolve import parse_command_line

    before, path, modules = os.getcwd(), list(sys.path), set(sys.modules)
    os.chdir(cwd)
    try:
        return parse_command_line(argv).config
    finally:
        os.chdir(before)
        sys.path[:] = path
        for name in set(sys.modules) - modules:  # the doc's my_env.py & co. must not shadow later tests' own
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(cwd)):
                del sys.modules[name]


def shape(cfg: Config, cwd: Path) -> tuple[str, Path]:
    """(the run's settings but for NOT_SHAPE, as JSON; its run directory in `cwd`)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SHAPE}
    return json.dumps(settings, sort_keys=True, default=str), cwd / cfg.run_dir


def common_cut(args: list[str], cwd: Path) -> int | None:
    """Where asyncrl-compare's --at-frames can cut the runs of its groups (its positional arguments), whose budgets this
    test set: the frames by which every run has a record of the compared metric and none has stopped; None when
    there is no such point (each run's only record of the metric is its last)."""
    metric = args[args.index("--metric") + 1] if "--metric" in args else "episode_return_mean"
    groups = [cwd / a for a in args if not a.startswith("-") and (cwd / a).is_dir()]
    firsts, finals = [], []
    for metrics in (m for group in groups for m in group.glob("*/metrics.jsonl")):
        records = [r for r in map(json.loads, metrics.read_text().splitlines()) if "frames" in r]
        firsts.append(min((r["frames"] for r in records if r.get(metric) is not None), default=0))
        finals.append(max((r["frames"] for r in records), default=0))
    cut = max(firsts, default=0)
    return cut if finals and 0 < cut <= min(finals) else None


class DocSession:
    """The directory every doc runs in, and the runs trained there so far by their settings (NOT_SHAPE aside)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.trained: dict[str, Path] = {}
        for name, body in companion_files().items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(body)
        # as in a checkout (results.md trains on tests.multi_agent_envs:duel and examples.coop_signal:make)
        for tree in ("scripts", "benchmarks", "tests", "examples"):
            (work / tree).symlink_to(ROOT / tree)

    def run(self, command: DocCommand, seed: int) -> None:
        cwd = self.work
        for step in command.steps[:-1]:
            assert step[0] == "cd", f"{command.where}: only `cd DIR &&` may come before a command"
            cwd = cwd / fill(list(step[1:]), seed)[0]
        words = fill(list(command.words), seed)
        {"train": self.train, "tool": self.tool, "script": self.script}[kind(command)](words, cwd, command.where)

    def train(self, words: list[str], cwd: Path, where: str) -> None:
        env = dict(RUN_ENV, **dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w)))
        words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
        argv = budgeted(train_argv(tuple(words)) or [])
        for pattern, values in SMALLER:
            if re.search(pattern, " ".join(argv) + " "):
                argv = replaced(argv, values)
        if "--help" in argv or "--print-config" in argv:
            self.check(launcher.run("train", argv, cwd=cwd, env=env, timeout=60), where)
            return
        cfg = resolved(argv, cwd)
        if cfg.env.startswith(SLOW_START_ENVS):
            argv = replaced(argv, SLOW_START_LAYOUT | (MATCH_LAYOUT if network_match(cfg.env) else {}))
            cfg = resolved(argv, cwd)
        if cfg.algo == "appo" and "--resume" not in argv and cfg.frames < first_update_frames(cfg):
            argv = replaced(argv, {"--frames": str(first_update_frames(cfg))})
            cfg = resolved(argv, cwd)
        if "--report-interval" not in argv:  # a few records in a short run: asyncrl-plot draws a curve from two
            argv = [*argv, "--report-interval", "0.05"]
        key, run_dir = shape(cfg, cwd)
        resume = "--resume" in argv
        if not resume and run_dir.exists():  # an earlier alternative wrote there: keep it aside
            aside = next(p for i in range(100) if not (p := run_dir.with_name(f"{run_dir.name}.{i}")).exists())
            run_dir.rename(aside)
            self.trained.update({k: aside for k, v in self.trained.items() if v == run_dir})
        if not resume and key in self.trained:
            shutil.copytree(self.trained[key], run_dir)
            return
        if words[0] == "torchrun":  # the agent a fork of the warm interpreter, as `python -m torch.distributed.run`
            logs = ["--log-dir", str(cwd / "torchrun-logs")]  # not torchrun's default, a new directory under /tmp
            result = launcher.run("torch.distributed.run", [*words[1:words.index("-m")], *logs, "-m", "asyncrl.train",
                                                            *argv], cwd=cwd, env={**os.environ, **env}, timeout=240)
        else:
            result = launcher.run("train", argv, cwd=cwd, env=env, timeout=240)
        self.check(result, where)
        final = re.search(r"final checkpoint \S+ \(policy version (\d+)", result.stdout)
        # version 1 is the untrained first weights: a new run must end with an update
        assert final and int(final.group(1)) >= (0 if resume else 2), f"{where}: no trained policy\n{result.stdout}"
        assert list((run_dir / "checkpoints").glob("*.pt")), f"{where}: no checkpoint in {run_dir}"
        if not resume:
            self.trained[key] = run_dir

    def tool(self, words: list[str], cwd: Path, where: str) -> None:
        name, args = TOOLS[words[0]], words[1:]
        args = replaced(args, SHORTER.get(name, {}))
        for mode, values in DIAGNOSE_SHORTER.items():
            if name == "diagnose" and mode in args:
                args = replaced(args, values)
        if name == "compare" and "--window" in args:  # the runs' length, not 1,000 steps
            args = replaced(args, {"--window": "50"})
        if name == "compare" and "--at-frames" in args:
            cut = common_cut(args, cwd)
            args = replaced(args, {"--at-frames": str(cut)}) if cut else replaced(args, {}, drop=("--at-frames",))
        self.check(launcher.run(name, args, cwd=cwd, env=RUN_ENV, timeout=240), where)
        self.check_outputs(args, cwd, where)

    def script(self, words: list[str], cwd: Path, where: str) -> None:
        args = replaced(words[2:], SCRIPT_SHORTER.get(words[1], {}))
        result = launcher.run(f"{launcher.SCRIPT}{ROOT / words[1]}", args, cwd=cwd, timeout=240,
                              env={**os.environ, **RUN_ENV})
        self.check(result, where)
        self.check_outputs(args, cwd, where)

    @staticmethod
    def check(result: subprocess.CompletedProcess, where: str) -> None:
        assert result.returncode == 0, (f"{where}: {shlex.join(map(str, result.args))} -> {result.returncode}\n"
                                        f"{result.stdout[-1500:]}\n{result.stderr[-2000:]}")

    @staticmethod
    def check_outputs(args: list[str], cwd: Path, where: str) -> None:
        for flag in ("--out", "--video", "--seeds-curve"):
            if flag in args:
                out = cwd / args[args.index(flag) + 1]
                written = out.exists() or list(out.parent.glob(out.name + ".*"))  # an output prefix: OUT.csv
                assert written, f"{where}: {flag} {out} was not written"


RUNNABLE = ("train", "tool", "script")
DOCS_WITH_COMMANDS = sorted({c.where.rsplit(":", 1)[0] for c in COMMANDS if kind(c) in RUNNABLE and not not_here(c)},
                            key=lambda d: (d != "README.md", d))
# Docs that need no run of another doc: they run in a directory of their own, one after another, in a test file of
# their own, so that pytest-xdist can give them to another worker than the rest (the learning results and their
# notes are about half the recipes' time).
STANDALONE = ("docs/results.md", "docs/notes/cartpole.md",
              *(f"docs/notes/{p.name}" for p in sorted((ROOT / "docs" / "notes").glob("results-*.md"))))


def run_doc(session: DocSession, doc: str) -> None:
    """Every runnable command of `doc` in its order, each seed placeholder for S = 0, 1 and 2."""
    for command in COMMANDS:
        if not command.where.startswith(doc + ":") or kind(command) not in RUNNABLE or not_here(command):
            continue
        for seed in (0, 1, 2) if has_seed_placeholder(command.words) else (0,):  # the docs' seeds: S = 0, 1, 2
            t = time.monotonic()
            session.run(command, seed)
            print(f"{time.monotonic() - t:6.1f} s  {command.where} (S={seed}) {command.text[:80]}")
