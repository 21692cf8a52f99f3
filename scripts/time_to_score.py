"""Time to score on Pong, side by side: asyncrl, Sample Factory 2 and CleanRL's PPO Atari script, one after another.

Each system trains Pong for the same budget of emulator frames (frame skip 4) from its own interpreter, with
its own settings, at the niceness this script has; its own logs are read back into one curve per system:
the mean raw game score of the last 100 games (fewer before 100 have ended) against frames and seconds.

  asyncrl  `asyncrl-train --env atari_pong --frames N --seed S` (its defaults); RUN_DIR/metrics.jsonl's
           `frames`, `time` (seconds since the trainer started) and `episode_return_mean`.
  sf2      `python -m sf_examples.atari.train_atari --env=atari_pong` (the example's Atari defaults) with
           `--train_for_env_steps=N --seed=S --device=cpu`; its log's `Fps is ... Total num frames: F` lines, then
           `Avg episode reward: R` (the mean of its last 100 games); seconds from the log's timestamps.
  cleanrl  CleanRL's `ppo_atari.py` run unmodified with `--env-id PongNoFrameskip-v4 --total-timesteps N/4
           --seed S --no-cuda`; its stdout's `global_step=G, episodic_return=[R]` lines (frames = 4 G, one
           line a game, the mean of the last 100 taken here), each stamped with its arrival time.

Writes DIR/table.md (frames and seconds to +18 and +20, frames/s), DIR/curves.png and DIR/<system>.csv;
each system's raw log stays in DIR/<system>/. A peer whose interpreter is not given is skipped with a note.

A budget longer than one sitting: `--timeout S` stops each system after S seconds, and the same command with
`--resume` continues the systems that had not finished from their own checkpoints (asyncrl `--resume`, Sample
Factory's default `--restart_behavior=resume`; CleanRL's script cannot resume and is refused), skipping those
that had. Seconds are then the systems' running time: the pauses between sittings are left out.

    .venv/bin/python scripts/time_to_score.py --frames 10000000 --out /tmp/tts \\
        --sf2-python /tmp/sf2venv/bin/python --cleanrl-python /tmp/cleanrlvenv/bin/python \\
        --cleanrl-script /tmp/cleanrl_src/cleanrl/ppo_atari.py
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

from asyncrl.bench.sample_factory import stop_process_group

SYSTEMS = ("asyncrl", "sf2", "cleanrl")
LEVELS = (18.0, 20.0)
FRAMESKIP = 4
WINDOW = 100  # games in the running mean
STOP_TIMEOUT_S = 60.0

Point = tuple[int, float, float]  # (frames, seconds, mean return of the last games)
Segment = dict[str, float]  # one sitting of a system: {"started": epoch seconds, "wall_s": how long it ran}

SF2_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\]"
SF2_FRAMES = re.compile(SF2_STAMP + r" Fps is .*?Total num frames: (\d+)")
SF2_REWARD = re.compile(SF2_STAMP + r" Avg episode reward: \[?\(?(?:0, )?'?(-?[\d.]+(?:e-?\d+)?)")
CLEANRL_LINE = re.compile(r"^\[\+([\d.]+)\] global_step=(\d+), episodic_return=\[?(-?[\d.]+(?:e-?\d+)?)")


class InputError(ValueError):
    """A flag or path this script cannot run with."""


# ---------------------------------------------------------------- parsers (each system's own log -> points)

def parse_asyncrl(lines: Iterable[str]) -> list[Point]:
    """Points of an asyncrl metrics.jsonl: records with finite `frames`, `time` and `episode_return_mean`, from the
    one at which `episodes` reached WINDOW (before it the mean is over fewer games)."""
    points = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        f, t, ret = r.get("frames"), r.get("time"), r.get("episode_return_mean")
        if r.get("episodes", WINDOW) < WINDOW:
            continue
        if all(isinstance(v, int | float) and math.isfinite(v) for v in (f, t, ret)):
            points.append((int(f), float(t), float(ret)))
    return points


def parse_sf2(lines: Iterable[str], segments: Sequence[Segment] | None = None,
              full: Sequence[tuple[float, int]] | None = None) -> list[Point]:
    """Points of a Sample Factory log: each `Avg episode reward` line paired with the frame count of the `Fps is`
    line before it; seconds of running time over `segments` (when each sitting started, epoch seconds, and how
    long it ran), or since the first timestamp of the log. Frames done again after a resume replace the first go
    (`redone`). Its mean restarts at each sitting and covers fewer than WINDOW games until that many end: with
    `full` ((epoch seconds, frames) at which a sitting's mean first covered WINDOW games, `sf2_window_full`), a
    sitting's points before its own entry are left out, and all of a sitting that has none."""
    points: list[Point] = []
    frames: int | None = None
    origin = None
    for line in lines:
        if m := SF2_FRAMES.search(line):
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            origin = stamp if origin is None else origin
            frames = int(m.group(2))
        elif (m := SF2_REWARD.search(line)) and frames is not None and origin is not None:
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if full is not None and not window_full(stamp, frames, segments or [], full):
                continue
            seconds = running_seconds(stamp, segments) if segments else stamp - origin
            points.append((frames, round(seconds, 3), float(m.group(2))))
    return redone(points)


def sitting_of(stamp: float, segments: Sequence[Segment]) -> int:
    """The index of the sitting under way at epoch seconds `stamp` (0 before any or without segments)."""
    index = 0
    for i, seg in enumerate(segments):
        if seg["started"] <= stamp:
            index = i
    return index


def window_full(stamp: float, frames: int, segments: Sequence[Segment], full: Sequence[tuple[float, int]]) -> bool:
    """Whether a Sample Factory mean logged at `stamp` and `frames` covers WINDOW games of its sitting."""
    sitting = sitting_of(stamp, segments)
    return any(sitting_of(t, segments) == sitting and f <= frames for t, f in full)


def sf2_window_full(run_dir: Path) -> list[tuple[float, int]]:
    """(epoch seconds, frames) of the first `reward/reward` summary in each of Sample Factory's tensorboard files
    (one a sitting) under `run_dir`: 2.1.1 writes it once its episode deque holds --stats_avg (100) games (its other
    condition, more than 10 games after 300 s of `total_train_seconds`, never holds: that counter stays 0)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for path in sorted(run_dir.glob("*/.summary/0/events.out.tfevents.*")):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        if "reward/reward" in events.Tags()["scalars"]:
            first = min(events.Scalars("reward/reward"), key=lambda e: e.step)
            found.append((first.wall_time, int(first.step)))
    return found


def running_seconds(stamp: float, segments: Sequence[Segment]) -> float:
    """Epoch seconds `stamp` as seconds of running time: the earlier sittings' lengths plus the time into the
    sitting that had started by then (the first one for a stamp before any)."""
    index = sitting_of(stamp, segments)
    return sum(seg["wall_s"] for seg in segments[:index]) + max(0.0, stamp - segments[index]["started"])


def redone(points: Sequence[Point]) -> list[Point]:
    """`points` where a resumed run went back to its checkpoint's frames: the points it did again are dropped from
    the first go, so frames rise throughout."""
    kept: list[Point] = []
    for p in points:
        while kept and kept[-1][0] > p[0]:
            kept.pop()
        kept.append(p)
    return kept


def parse_cleanrl(lines: Iterable[str]) -> list[Point]:
    """Points of CleanRL's stamped stdout (`[+SECONDS] global_step=G, episodic_return=[R]`): one a game from
    the WINDOW-th on, with the mean of the last WINDOW games and frames = 4 G."""
    points: list[Point] = []
    last: deque[float] = deque(maxlen=WINDOW)
    for line in lines:
        if m := CLEANRL_LINE.search(line):
            last.append(float(m.group(3)))
            if len(last) == WINDOW:  # a mean of WINDOW games, as the other systems' points
                points.append((int(m.group(2)) * FRAMESKIP, float(m.group(1)), sum(last) / len(last)))
    return points


# ---------------------------------------------------------------- summary

def first_reach(points: Sequence[Point], level: float) -> tuple[int, float] | None:
    """(frames, seconds) of the first point at or above `level`, or None."""
    return next(((f, t) for f, t, r in points if r >= level), None)


def summary_row(system: str, points: Sequence[Point], wall_s: float | None) -> str:
    def reach(level: float) -> str:
        hit = first_reach(points, level)
        return f"{hit[0]:,} / {hit[1]:,.0f}" if hit else "not reached"

    if not points:
        return f"| {system} | no scores logged | | | | | |"
    frames, seconds, last = points[-1]
    fps = f"{frames / seconds:,.0f}" if seconds > 0 else "-"
    best = max(r for _, _, r in points)
    wall = f"{wall_s:,.0f}" if wall_s is not None else "-"
    return (f"| {system} | {reach(LEVELS[0])} | {reach(LEVELS[1])} | {last:.2f} at {frames:,} | {best:.2f} | "
            f"{fps} | {wall} |")


def write_table(path: Path, rows: list[str], header: str) -> None:
    head = ("| system | +18: frames / s | +20: frames / s | last mean | best mean | frames/s | wall s |\n"
            "|---|---|---|---|---|---|---|\n")
    path.write_text(header + "\n\n" + head + "\n".join(rows) + "\n")


def write_csv(path: Path, points: Sequence[Point]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["frames", "seconds", "return_mean_100"])
        w.writerows(points)


def unbroken(points: Sequence[Point], factor: float = 20.0) -> list[list[Point]]:
    """`points` cut where frames jump by more than `factor` times their median step: the games a resumed Sample
    Factory sitting played before its mean covered 100 of them have no point, and a line across them would draw
    means nobody measured."""
    steps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]))
    limit = factor * max(steps[len(steps) // 2], 1) if steps else math.inf
    runs: list[list[Point]] = []
    for p in points:
        if not runs or p[0] - runs[-1][-1][0] > limit:
            runs.append([])
        runs[-1].append(p)
    return runs


def plot(path: Path, curves: dict[str, Sequence[Point]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, col, label in ((axes[0], 0, "frames"), (axes[1], 1, "seconds")):
        for (system, points), color in zip(curves.items(), ("C0", "C1", "C2")):
            for i, run in enumerate(unbroken(points)):
                ax.plot([p[col] for p in run], [p[2] for p in run], color=color, label=None if i else system)
        for level in LEVELS:
            ax.axhline(level, color="grey", ls=":", lw=1)
        ax.set(xlabel=label, title=f"Pong: mean of the last 100 games vs {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("game score")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- runs

def command(system: str, args: argparse.Namespace, run_dir: Path, resume: bool = False) -> list[str]:
    """The command of `system`, run in `run_dir` (its own folder under --out); `resume`: continue its run there
    (Sample Factory resumes an experiment it finds by itself)."""
    train = Path(sys.executable).with_name("asyncrl-train")
    return {
        "asyncrl": [str(train), "--env", "atari_pong", "--frames", str(args.frames), "--seed", str(args.seed),
                    "--train-dir", str(run_dir), "--experiment", "pong", *(["--resume"] if resume else [])],
        "sf2": [str(args.sf2_python), "-m", "sf_examples.atari.train_atari", "--env=atari_pong", "--experiment=pong",
                f"--train_dir={run_dir}", f"--train_for_env_steps={args.frames}", f"--seed={args.seed}",
                "--device=cpu", "--with_wandb=False"],
        "cleanrl": [str(args.cleanrl_python), str(args.cleanrl_script), "--env-id", "PongNoFrameskip-v4",
                    "--total-timesteps", str(args.frames // FRAMESKIP), "--seed", str(args.seed), "--no-cuda"],
    }[system]


def run_system(system: str, cmd: list[str], run_dir: Path, timeout_s: float | None,
               earlier: Sequence[Segment] = ()) -> dict[str, object]:
    """Run one system to completion (or `timeout_s`); its output to run_dir/stdout.log, each line stamped with
    its seconds of running time (after the `earlier` sittings' when resuming, appended to their log). Returns its
    run.json record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    offset = sum(seg["wall_s"] for seg in earlier)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system == "sf2":  # its resume loads its own checkpoints with torch.load's old default; since torch 2.6 that
        # default refuses the numpy scalar it stores once it has a best score, and it silently starts from scratch
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    if system == "cleanrl":  # its script imports cleanrl_utils from the folder above it
        env["PYTHONPATH"] = str(Path(cmd[1]).resolve().parent.parent)
    print(f"[{system}] {' '.join(cmd)}", flush=True)
    started, t0, timed_out, interrupted = time.time(), time.monotonic(), False, False
    with open(run_dir / "stdout.log", "a" if earlier else "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=run_dir, env=env,
                                text=True, errors="replace", start_new_session=True)

        def copy() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(f"[+{offset + time.monotonic() - t0:.3f}] {line}")
                log.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            print(f"[{system}] --timeout {timeout_s:g} s reached: stopping it", flush=True)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: this sitting ends here; --resume continues it
            interrupted = True
            print(f"[{system}] interrupted: stopping it (continue with --resume)", flush=True)
        finally:
            stop_process_group(proc, STOP_TIMEOUT_S)
            reader.join(timeout=10.0)
    segments = [*earlier, {"started": started, "wall_s": round(time.monotonic() - t0, 1)}]
    return {"command": cmd, "started": segments[0]["started"], "wall_s": round(offset + segments[-1]["wall_s"], 1),
            "segments": segments, "returncode": proc.returncode, "timed_out": timed_out or interrupted,
            "interrupted": interrupted, "loadavg_after": os.getloadavg()}


def finished(meta: dict[str, object]) -> bool:
    """Whether a run.json record is of a run that ended by itself, successfully."""
    return meta.get("returncode") == 0 and not meta.get("timed_out")


def segments_of(meta: dict[str, object]) -> list[Segment]:
    """The sittings of a run.json record (one, for a record written before sittings were kept)."""
    return list(meta.get("segments") or [{"started": meta["started"], "wall_s": meta["wall_s"]}])


def read_points(system: str, run_dir: Path, meta: dict[str, object]) -> list[Point]:
    if system == "asyncrl":  # its `time` is running time: a resumed run goes on from its checkpoint's
        path = run_dir / "pong" / "metrics.jsonl"
        return redone(parse_asyncrl(path.read_text().splitlines())) if path.exists() else []
    if system == "sf2":  # its stdout (stamped here) carries the runner's own timestamps
        return parse_sf2((run_dir / "stdout.log").read_text(errors="replace").splitlines(), segments_of(meta),
                         sf2_window_full(run_dir))
    return parse_cleanrl((run_dir / "stdout.log").read_text(errors="replace").splitlines())


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"time_to_score: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="time_to_score", description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--frames", type=float, required=True, help="emulator frames per system (frame skip 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="folder for table.md, curves.png, <system>.csv, logs")
    p.add_argument("--sf2-python", type=Path, help="interpreter of a venv with sample-factory and ale-py")
    p.add_argument("--cleanrl-python", type=Path, help="interpreter of a venv with CleanRL's Atari requirements")
    p.add_argument("--cleanrl-script", type=Path, help="CleanRL's ppo_atari.py (cleanrl_utils/ beside its folder)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    p.add_argument("--timeout", type=float, help="stop a system after this many seconds (default: none)")
    p.add_argument("--resume", action="store_true",
                   help="continue the systems in --out that had not finished (stopped at --timeout or failed) from "
                        "their checkpoints; those that had are read, not run again (not CleanRL: it cannot resume)")
    p.add_argument("--parse-only", action="store_true", help="read the logs already in --out; run nothing")
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> list[str]:
    """The systems to run; raises InputError on bad input."""
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise InputError(f"--systems {args.systems!r}: choose from {','.join(SYSTEMS)}")
    if not (args.frames >= 10_000 and math.isfinite(args.frames)):
        raise InputError(f"--frames {args.frames:g}: give at least 10000")
    args.frames = int(args.frames)
    args.out = args.out.absolute()  # each system runs in its own folder under it: paths in its command must hold there
    for flag in ("sf2_python", "cleanrl_python", "cleanrl_script"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            raise InputError(f"--{flag.replace('_', '-')} {path}: no such file")
        if path is not None:
            setattr(args, flag, path.absolute())  # each run's cwd is its own folder; a venv's link stays a link
    if "cleanrl" in systems and args.cleanrl_python and not args.cleanrl_script:
        raise InputError("--cleanrl-python needs --cleanrl-script (CleanRL's ppo_atari.py)")
    meta = args.out / "cleanrl" / "run.json"
    if args.resume and "cleanrl" in systems and meta.exists() and not finished(json.loads(meta.read_text())):
        raise InputError("--resume: CleanRL's ppo_atari.py cannot continue a run; leave cleanrl out of --systems, "
                         "or run it again from the start in another --out")
    return systems


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed script still stops the run it started
    # Started in the background by a shell, SIGINT is ignored here and in every child that inherits it: a run
    # stopped at --timeout would then be killed after the grace period instead of saving its checkpoint.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        systems = check(args)
        args.out.mkdir(parents=True, exist_ok=True)
    except InputError as exc:
        print(f"time_to_score: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"time_to_score: cannot create {args.out} ({exc.strerror})", file=sys.stderr)
        return 2
    given = {"asyncrl": True, "sf2": args.sf2_python is not None, "cleanrl": args.cleanrl_python is not None}
    curves: dict[str, list[Point]] = {}
    rows, notes = [], []
    for system in systems:
        if not given[system] and not args.parse_only:
            print(f"[{system}] skipped: no --{system}-python given", flush=True)
            continue
        run_dir = args.out / system
        meta_path = run_dir / "run.json"
        if args.parse_only:
            if not meta_path.exists():
                print(f"[{system}] skipped: no {meta_path}", flush=True)
                continue
            meta = json.loads(meta_path.read_text())
        elif args.resume and meta_path.exists() and finished(earlier := json.loads(meta_path.read_text())):
            print(f"[{system}] finished before: read, not run again", flush=True)
            meta = earlier
        else:
            resume = args.resume and meta_path.exists()
            before = segments_of(json.loads(meta_path.read_text())) if resume else []
            cmd = command(system, args, run_dir, resume)
            meta = run_system(system, cmd, run_dir, args.timeout, before)
            meta_path.write_text(json.dumps(meta, indent=1))
        points = read_points(system, run_dir, meta)
        curves[system] = points
        write_csv(args.out / f"{system}.csv", points)
        rows.append(summary_row(system, points, meta["wall_s"]))
        stop = ""
        if meta.get("timed_out"):
            stop = ", interrupted" if meta.get("interrupted") else ", stopped at --timeout"
        notes.append(f"- {system} (exit {meta['returncode']}{stop}, load after {meta['loadavg_after'][0]:.1f}): "
                     f"`{' '.join(map(str, meta['command']))}`")
        print(rows[-1], flush=True)
        if meta.get("interrupted") and not args.parse_only:
            break  # the systems after it are not started
    if not curves:
        print("time_to_score: no system ran", file=sys.stderr)
        return 2
    header = (f"Pong, {args.frames:,} frames each, seed {args.seed}. +18/+20: first frames / seconds at which the "
              f"mean of the last 100 games reached it; seconds of running time from launch (pauses between --resume "
              f"sittings left out; asyncrl: its trainer's `time`); frames/s: "
              f"frames of the last score over its seconds, start-up included.\n\n"
              + "\n".join(notes))
    write_table(args.out / "table.md", rows, header)
    plot(args.out / "curves.png", curves)
    print(f"{args.out / 'table.md'}\n{args.out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
