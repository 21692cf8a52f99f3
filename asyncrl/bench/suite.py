"""The full and quick suites: which measurements run, each in a fresh process, and the ratios between them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from asyncrl.bench.machine import load_average, usable_cpus
from asyncrl.bench.settings import (
    BATCHED_ENV,
    BATCHED_ENVS,
    BATCHED_LAYOUT,
    NAIVE_ENVS,
    NULL_WIDE_ENVS_PER_WORKER,
    BenchSettings,
)
from asyncrl.system import install_hint

SUITE_ENVS = ("atari_pong", "CartPole-v1")
ENV_MODES = ("env_only", "sampler", "train", "naive")
# VizDoom, when the extra is installed: the simplest scenario and a battle against 7 bots, the scenario
# Sample Factory also ships (as its own doom_deathmatch_bots). No naive row: the naive loop runs gymnasium ids
# and Atari only.
DOOM_ENVS = ("doom_basic", "doom_deathmatch_bots")
DOOM_MODES = ("env_only", "sampler", "train")
QUICK_DOOM_ENVS = ("doom_basic",)  # --quick: one scenario, the two ends of the pipeline
QUICK_DOOM_MODES = ("env_only", "train")
# Every game is an engine process of its own (with 7 bots in the deathmatch), so Doom runs the reference
# 4 workers with 8 envs each (4 per split): 32 engines rather than 64, still one batch of 1024 in flight.
DOOM_LAYOUT = {"envs_per_worker": 8}
# EnvPool's Pong beside ale_py's (atari_pong), when the envpool extra is installed: the same game, 84x84 frames,
# 4-frame stacks and frameskip 4, through envpool:. No naive row: the naive loop runs gymnasium ids and Atari only.
ENVPOOL_ENV = "envpool:Pong-v5"
ENVPOOL_MODES = ("env_only", "sampler", "train")
QUICK_ENVPOOL_MODES = ("env_only", "train")
# Seconds measured and windows per figure. The learner frees trajectory slots a batch at a time, so with
# learning on the env-step count moves in steps of one batch: train windows must span several updates.
QUICK = {"seconds": 9.0, "repeats": 3}  # 3 windows of 3 s after a 3 s warm-up
QUICK_TRAIN = {"seconds": 15.0, "repeats": 3}
FULL = {"seconds": 40.0, "repeats": 5}  # 5 windows of 8 s after an 8 s warm-up
# replay: every figure (insert, sample, PER update; 2 observation kinds x uniform / prioritized) has its own
# windows, and each buffer's first fill is bounded to replay_fill_gib of memory.
QUICK_REPLAY = {"seconds": 0.9, "repeats": 3, "replay_fill_gib": 0.05}
FULL_REPLAY = {"seconds": 5.0, "repeats": 5}


def timing(mode: str, quick: bool) -> dict[str, Any]:
    if mode == "replay":
        return QUICK_REPLAY if quick else FULL_REPLAY
    if not quick:
        return FULL
    return QUICK_TRAIN if mode == "train" else QUICK


def vizdoom_missing() -> str | None:
    """Why the Doom rows cannot run (vizdoom does not import), or None."""
    try:
        import vizdoom  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken native library
        return f"vizdoom does not import ({type(exc).__name__}: {exc}); {install_hint('doom')}"
    return None


def envpool_missing() -> str | None:
    """Why the EnvPool Pong rows cannot run (envpool is not installed), or None."""
    import importlib.util

    return None if importlib.util.find_spec("envpool") else f"{ENVPOOL_ENV} skipped: {install_hint('envpool')}"


def modes_for(env: str, quick: bool) -> tuple[str, ...]:
    if env.startswith("doom_"):
        return QUICK_DOOM_MODES if quick else DOOM_MODES
    if env.startswith("envpool:"):
        return QUICK_ENVPOOL_MODES if quick else ENVPOOL_MODES
    return ENV_MODES


BATCHED_MODES = ("sampler", "train", "naive_vector")
BATCHED_GROUP = f"{BATCHED_ENV} x {BATCHED_ENVS:,} envs (batched)"
# --num-policies: the env's train row again with two policies (each trains on half the env columns), same layout
POPULATION_ENV, POPULATION_POLICIES = "CartPole-v1", 2
POPULATION_GROUP = f"{POPULATION_ENV} x {POPULATION_POLICIES} policies"
# --rnn gru: the env's train row again with Sample Factory's default core (a 512-unit GRU between the encoder and
# the heads), same layout; on Doom it is compared with Sample Factory 2's own row, which runs its GRU
RNN_ENVS = ("atari_pong", "doom_basic")
RNN_ARGS = ("--rnn", "gru")
RNN_LABEL = "--rnn gru"


# Ray (the full suite): the env's train row with half its workers' envs on remote actor groups (a Ray node on this
# machine, started and stopped by the row)
RAY_ENV = "atari_pong"
RAY_GROUP = f"{RAY_ENV} via Ray"


def ray_missing() -> str | None:
    """Why the Ray row cannot run (ray is not installed), or None."""
    import importlib.util

    return None if importlib.util.find_spec("ray") else f"the {RAY_GROUP} row skipped: {install_hint('ray')}"


def rnn_group(env: str) -> str:
    return f"{env} {RNN_LABEL}"


@dataclass(frozen=True)
class Step:
    settings: BenchSettings
    scaling: bool = False  # a point of the sampler scaling curve
    group: str = ""  # the rows compared with each other (ratios); "" for the env's own rows
    label: str = ""  # what sets the row apart from its mode's usual one (shown beside the mode)


def scaling_points(cpus: int) -> list[int]:
    """1, 2, 4, ... up to twice the cores."""
    points, w = [], 1
    while w <= 2 * cpus:
        points.append(w)
        w *= 2
    return points


def plan(envs: list[str], quick: bool, base: BenchSettings, cpus: int | None = None,
         overrides: dict[str, Any] | None = None) -> list[Step]:
    """env_only, sampler, train and naive per env (Doom: no naive, 8 envs per worker), then null at the reference
    layout and with 32 envs per request, then replay; the full suite adds sampler scaling on envs[0].

    `overrides` (seconds, repeats) replace the suite's own timing for every step.
    """
    steps = []
    for env in envs:
        for mode in modes_for(env, quick):
            changes: dict[str, Any] = {"env": env, **timing(mode, quick), **(overrides or {})}
            if mode == "naive":
                changes.update(workers=NAIVE_ENVS, envs_per_worker=1)
            if env.startswith("doom_"):
                changes.update(DOOM_LAYOUT)
            steps.append(Step(base.for_mode(mode, **changes)))
            if mode == "train" and env in RNN_ENVS:
                steps.append(Step(base.for_mode(mode, **changes, extra_trainer_args=(*base.extra_trainer_args,
                                                                                     *RNN_ARGS)),
                                  group=rnn_group(env), label=RNN_LABEL))
            if mode == "train" and env == RAY_ENV and not quick and not ray_missing():
                half = max(1, changes.get("workers", base.workers) // 2)  # as many envs, half of them remote
                steps.append(Step(base.for_mode("ray_train", **{**changes, "workers": half}), group=RAY_GROUP,
                                  label=f"+ {half} remote groups"))
            if mode == "train" and env.startswith("doom_") and base.sf2_python:  # Sample Factory beside it
                steps.append(Step(base.for_mode("sf2_train", **changes, extra_trainer_args=())))  # not its flags
    if BATCHED_ENV in envs:  # the guide's 4,096 envs through the batched backend, and the naive loop on them
        for mode in BATCHED_MODES:
            layout = {**BATCHED_LAYOUT, **({"workers": BATCHED_ENVS, "envs_per_worker": 1}
                                           if mode == "naive_vector" else {})}
            steps.append(Step(base.for_mode(mode, env=BATCHED_ENV, **layout, **timing(mode, quick),
                                            **(overrides or {})), group=BATCHED_GROUP))
    if POPULATION_ENV in envs:
        changes = {"env": POPULATION_ENV, **timing("train", quick), **(overrides or {}),
                   "extra_trainer_args": (*base.extra_trainer_args, "--num-policies", str(POPULATION_POLICIES))}
        steps.append(Step(base.for_mode("train", **changes), group=POPULATION_GROUP,
                          label=f"{POPULATION_POLICIES} policies"))
    steps.append(Step(base.for_mode("null", **timing("null", quick), **(overrides or {}))))
    steps.append(Step(base.for_mode("null", envs_per_worker=NULL_WIDE_ENVS_PER_WORKER, minibatches=1,
                                    **timing("null", quick), **(overrides or {}))))  # 1 trajectory per batch
    steps.append(Step(base.for_mode("replay", **timing("replay", quick), **(overrides or {}))))
    if not quick:
        for w in scaling_points(cpus or usable_cpus()):
            if w != base.workers:  # the reference sampler row is that point
                changes = {"env": envs[0], "workers": w, **timing("sampler", quick), **(overrides or {})}
                steps.append(Step(base.for_mode("sampler", **changes), scaling=True))
    return steps


def command(s: BenchSettings) -> list[str]:
    return [sys.executable, "-m", "asyncrl.cli.bench", "--env", s.env, "--mode", s.mode,
            "--workers", str(s.workers), "--envs-per-worker", str(s.envs_per_worker),
            "--rollout", str(s.rollout), "--batch-size", str(s.batch_size), "--minibatches", str(s.minibatches),
            "--epochs", str(s.epochs), "--hidden-size", str(s.hidden_size),
            "--seconds", str(s.seconds), "--repeats", str(s.repeats),
            "--replay-capacity", str(s.replay_capacity), "--replay-fill-gib", str(s.replay_fill_gib),
            "--device", s.device,
            *(["--sf2-python", s.sf2_python] if s.sf2_python else []),
            *(["--", *s.extra_trainer_args] if s.extra_trainer_args else [])]


def run_step(step: Step, log=print) -> dict[str, Any]:
    """One measurement in a fresh process; a failure becomes a record with `error` so the suite goes on."""
    s = step.settings
    layout = f" (capacity {s.replay_capacity:,})" if s.mode == "replay" else f" ({s.workers} x {s.envs_per_worker})"
    log(f"asyncrl-bench: {s.env} {s.mode}{layout} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(command(s), stdout=subprocess.PIPE, text=True)
    try:
        stdout, _ = proc.communicate()
    except KeyboardInterrupt:  # Ctrl-C reached the child too: let it stop its run and clean up first
        proc.wait(timeout=90)
        raise
    record = last_record(stdout)
    if record is None:
        record = {"env": s.env, "mode": s.mode, "workers": s.workers, "envs_per_worker": s.envs_per_worker,
                  "sps": None, "fps": None, "repeats": 0, "error": f"exit code {proc.returncode}"}
    record["scaling"] = step.scaling
    record["group"] = step.group or record["env"]
    record["label"] = step.label
    record["step_wall_s"] = round(time.monotonic() - started, 1)  # start-up and stop included
    return record


def last_record(stdout: str) -> dict[str, Any] | None:
    """The last line of stdout that is a JSON record (native libraries may print banners around it)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def find(records: list[dict[str, Any]], group: str, mode: str) -> dict[str, Any] | None:
    """The measured record of `mode` among the rows of `group` (an env's own rows: the env's name); "naive" also
    finds a group's naive_vector row."""
    modes = (mode, "naive_vector") if mode == "naive" else (mode,)
    return next((r for r in records if r.get("group", r["env"]) == group and r["mode"] in modes
                 and not r.get("scaling") and r.get("sps")), None)


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return round(a["sps"] / b["sps"], 3) if a and b and b["sps"] else None


def same_device_ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """`ratio` for two trainers: only when their models ran on the same device (like with like)."""
    if a and b and a.get("device", "cpu") != b.get("device", "cpu"):
        return None
    return ratio(a, b)


def add_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set sampler/env_only on sampler rows and train/sampler, train/naive, train/SF2 on train rows; return one
    row per env. A `--rnn gru` row gets its ratio over the env's feed-forward train row and over Sample Factory 2
    (which runs its GRU); a population row its ratio over one policy."""
    rows = []
    variants = {POPULATION_GROUP, RAY_GROUP, *map(rnn_group, RNN_ENVS)}
    own = [r for r in records
           if r["mode"] not in ("null", "replay", "sf2_train", "ray_train") and r.get("group") not in variants]
    for env in dict.fromkeys(r.get("group", r["env"]) for r in own):
        env_only, sampler, train, naive = (find(records, env, m) for m in ENV_MODES)
        row = {"env": env, "sampler_over_env_only": ratio(sampler, env_only),
               "train_over_sampler": ratio(train, sampler), "asyncrl_over_naive": same_device_ratio(train, naive),
               "asyncrl_over_sf2": same_device_ratio(train, find(records, env, "sf2_train"))}
        if sampler:
            sampler["sampler_over_env_only"] = row["sampler_over_env_only"]
        if train:
            train["train_over_sampler"] = row["train_over_sampler"]
            train["asyncrl_over_naive"] = row["asyncrl_over_naive"]
            train["asyncrl_over_sf2"] = row["asyncrl_over_sf2"]
        rows.append(row)
    ray = find(records, RAY_GROUP, "ray_train")
    if ray:
        ray["over_local_train"] = ratio(ray, find(records, RAY_ENV, "train"))
    population = find(records, POPULATION_GROUP, "train")
    if population:
        population["over_one_policy"] = ratio(population, find(records, POPULATION_ENV, "train"))
    for env in RNN_ENVS:
        gru = find(records, rnn_group(env), "train")
        if gru:
            gru["over_feed_forward"] = same_device_ratio(gru, find(records, env, "train"))
            gru["asyncrl_over_sf2"] = same_device_ratio(gru, find(records, env, "sf2_train"))
    return rows


def suite_envs(env: str | None, quick: bool = False) -> tuple[list[str], str | None]:
    """The envs to measure (`env` alone, or the suite's, with EnvPool's Pong beside atari_pong when envpool is
    installed and Doom's when vizdoom imports) and why any are skipped (None when none is)."""
    if env:
        return [env], None
    doom = QUICK_DOOM_ENVS if quick else DOOM_ENVS
    pool = envpool_missing()
    envs = [SUITE_ENVS[0], *([] if pool else [ENVPOOL_ENV]), *SUITE_ENVS[1:]]
    missing = vizdoom_missing()
    skipped = [f"{', '.join(doom)} skipped: {missing}"] if missing else []
    return [*envs, *([] if missing else doom)], "; ".join([*skipped, *([pool] if pool else [])]) or None


def run_suite(envs: list[str], quick: bool, base: BenchSettings, overrides: dict[str, Any] | None = None,
              log=print) -> tuple[list[dict], list[dict]]:
    load_before = load_average()
    records = [run_step(step, log) for step in plan(envs, quick, base, overrides=overrides)]
    for r in records:
        r.setdefault("machine", {})["load_avg_before_suite"] = load_before
        r["suite"] = "quick" if quick else "full"
    return records, add_ratios(records)
