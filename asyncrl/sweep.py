"""Sweeps: a grid of settings x seeds, each point an `asyncrl-train` run (a fork of the sweep), at most K at once.

A sweep file (YAML or JSON) holds `base` (flags every run gets), `grid` (flag -> list of values; every
combination is one setting), `seeds` (default [0]) and `group` (default: the file's name). Keys are flag names
with or without the leading dashes, in dashes or underscores (`lr`, `batch-size`, `--learner_threads`).

Run directories: `TRAIN_DIR/GROUP/<setting>/<setting>_seed<S>`, so the seeds of one setting share a directory
and `asyncrl-compare TRAIN_DIR/GROUP/*` compares the settings. Cores: with K concurrent runs on C cores each run
gets `--workers` and `--learner-threads` of max(1, C // K), unless `base` or `grid` sets them. Torch-free.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from asyncrl.config import Config, ConfigError, check_applicable
from asyncrl.forked_run import ForkedRun
from asyncrl.settings_file import SettingsFileError, load_settings_file

RESERVED = ("seed", "experiment", "train_dir", "resume")  # set by the sweep for each run
SHARED_CORES = ("workers", "learner_threads")  # sized to cores // K unless the file sets them
POLL_S = 0.2


class SweepError(ValueError):
    """A sweep file that cannot be run; reported as one line with exit code 2."""


@dataclass
class RunPlan:
    name: str  # <setting>_seed<S>
    setting: str
    seed: int
    run_dir: str
    args: list[str]  # asyncrl-train's arguments

    def command(self) -> str:
        return shlex.join(["asyncrl-train", *self.args])


@dataclass
class Sweep:
    group: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    train_dir: str


def _field_name(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


def normalize_flags(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Keys normalised to Config field names; unknown or reserved ones are errors."""
    known = {f.name for f in dataclasses.fields(Config) if f.metadata.get("cli", True)}  # flags only: no lr_base
    out = {}
    for key, value in values.items():
        name = _field_name(str(key))
        if name not in known:
            raise SweepError(f"{where}: unknown flag {key!r}; see asyncrl-train --help")
        if name in RESERVED and not (where == "base" and name == "train_dir"):
            raise SweepError(f"{where}: {key!r} is set by the sweep for each run; remove it (seeds go in 'seeds')")
        out[name] = value
    return out


def refuse_inapplicable(base: dict[str, Any], grid: dict[str, Any]) -> None:
    """Refuse, before any run starts, a flag that one of the sweep's --algo values does not read (`grid`: flag ->
    the values it takes)."""
    given = [name for name in (*base, *grid) if name != "algo"]
    for algo in grid.get("algo", [base.get("algo", Config.algo)]):
        try:
            check_applicable(str(algo), given)
        except ConfigError as exc:
            raise SweepError(str(exc)) from None


def parse_sweep(data: Any, default_group: str) -> Sweep:
    """Check a loaded sweep file; one-line SweepError on anything wrong."""
    if not isinstance(data, dict):
        raise SweepError("a sweep file holds a mapping with 'base', 'grid', 'seeds' and 'group'")
    unknown = set(data) - {"base", "grid", "seeds", "group"}
    if unknown:
        raise SweepError(f"unknown key(s) {sorted(unknown)}; a grid sweep file has base, grid, seeds and group "
                         f"(a search has 'search' instead of 'grid': see docs/sweeps.md)")
    base, grid = data.get("base") or {}, data.get("grid") or {}
    if not isinstance(base, dict) or not isinstance(grid, dict):
        raise SweepError("'base' and 'grid' must be mappings of flag -> value (grid: flag -> list of values)")
    base = normalize_flags(base, "base")
    grid = normalize_flags(grid, "grid")
    for name, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"grid: {name} must be a non-empty list of values")
    refuse_inapplicable(base, grid)
    seeds, group = parse_seeds(data), parse_group(data, default_group)
    train_dir = str(base.pop("train_dir", "train_dir"))
    return Sweep(group, base, grid, seeds, train_dir)


def parse_seeds(data: dict[str, Any]) -> list[int]:
    """The file's `seeds` (default [0]): distinct integers."""
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise SweepError("'seeds' must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise SweepError("'seeds' lists a seed twice")
    return list(seeds)


def parse_group(data: dict[str, Any], default_group: str) -> str:
    """The file's `group` (default: the file's name), a plain directory name."""
    group = str(data.get("group") or default_group)
    if not group or os.sep in group or group in (".", ".."):
        raise SweepError(f"'group' must be a plain directory name, not {group!r}")
    return group


def read_sweep_file(path: str) -> tuple[Any, str]:
    """The parsed YAML (.yaml, .yml) or JSON file and its default group (the file's name)."""
    try:
        data = load_settings_file(path)
    except SettingsFileError as exc:
        raise SweepError(str(exc)) from None
    return data, os.path.splitext(os.path.basename(path))[0]


def load_sweep(path: str) -> Sweep:
    """Read a YAML (.yaml, .yml) or JSON grid sweep file."""
    return parse_sweep(*read_sweep_file(path))


def flag_args(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, str(value)]


def setting_name(point: dict[str, Any]) -> str:
    """A directory name for one grid point, e.g. `lr-0.001_epochs-2` (`base` for an empty grid)."""
    if not point:
        return "base"
    parts = [f"{k.replace('_', '-')}-{v}" for k, v in point.items()]
    return "_".join(parts).replace(os.sep, "-").replace(" ", "")


def cores_per_run(concurrent: int, cores: int | None = None) -> int:
    """Each of K concurrent runs gets max(1, cores // K) rollout workers and learner threads."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // concurrent)


def plan(sweep: Sweep, concurrent: int, cores: int | None = None) -> list[RunPlan]:
    """One RunPlan per grid point x seed, in grid order then seed order."""
    share = cores_per_run(concurrent, cores)
    keys = list(sweep.grid)
    plans = []
    for combo in itertools.product(*(sweep.grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        setting = setting_name(point)
        flags = {**sweep.base, **point}
        for name in SHARED_CORES:
            flags.setdefault(name, share)
        group_dir = os.path.join(sweep.train_dir, sweep.group, setting)
        for seed in sweep.seeds:
            name = f"{setting}_seed{seed}"
            args = [a for k, v in flags.items() for a in flag_args(k, v)]
            args += ["--seed", str(seed), "--train-dir", group_dir, "--experiment", name]
            plans.append(RunPlan(name, setting, seed, os.path.join(group_dir, name), args))
    names = [p.run_dir for p in plans]
    if len(set(names)) != len(names):
        raise SweepError("two grid points give the same directory name; make the grid's values distinct")
    return plans


def start_run(p: RunPlan, entry: Callable[[list[str]], int]) -> tuple[ForkedRun, IO[str]]:
    """`entry(ARGS)` (asyncrl-train's command-line entry) in a fork of this process, its output in
    `<run_dir>.log`; the process and the open log. The run stays in the sweep's process group, so a terminal's
    Ctrl-C reaches it as it reaches the sweep."""
    os.makedirs(os.path.dirname(p.run_dir), exist_ok=True)
    log = open(p.run_dir + ".log", "w")  # noqa: SIM115 - closed by the caller when the run ends
    return ForkedRun(entry, p.args, log.fileno(), new_session=False), log


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_all(plans: list[RunPlan], concurrent: int, entry: Callable[[list[str]], int],
            out: Callable[..., None] = print) -> list[RunPlan]:
    """Run every plan as `entry(ARGS)` (start_run), at most `concurrent` at once; the failed ones.

    Each run's output goes to `<run_dir>.log` beside its run directory. A failed run is reported with the
    last line of its log and the sweep goes on.
    """
    pending = list(enumerate(plans, 1))
    running: dict[int, tuple[RunPlan, ForkedRun, float, Any]] = {}
    failed: list[RunPlan] = []
    total = len(plans)
    try:
        while pending or running:
            while pending and len(running) < concurrent:
                i, p = pending.pop(0)
                proc, log = start_run(p, entry)
                running[i] = (p, proc, time.monotonic(), log)
                out(f"[{i}/{total}] start {p.name}: {p.command()}", flush=True)
            time.sleep(POLL_S)
            for i in [i for i, (_, proc, _, _) in running.items() if proc.poll() is not None]:
                p, proc, t0, log = running.pop(i)
                log.close()
                took = time.monotonic() - t0
                if proc.returncode == 0:
                    out(f"[{i}/{total}] done  {p.name} ({took:.0f} s)", flush=True)
                else:
                    failed.append(p)
                    out(f"[{i}/{total}] FAILED {p.name} (exit {proc.returncode}, {took:.0f} s): "
                        f"{last_line(p.run_dir + '.log')} (log: {p.run_dir}.log)", flush=True)
    except KeyboardInterrupt:
        out("sweep: interrupted; stopping the running runs (each saves a checkpoint)", flush=True)
        for _, proc, _, _ in running.values():
            proc.send_signal(signal.SIGINT)  # SIGINT: asyncrl-train stops cleanly
        for p, proc, _, log in running.values():
            proc.wait()
            log.close()
            failed.append(p)
        failed.extend(p for _, p in pending)
    return failed
