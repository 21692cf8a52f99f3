"""The runner's side of a torchrun launch (no torch): where this rank sits, its settings, and its state.

`for_this_rank(cfg)` is called by the launcher before the settings are validated; the `DataParallel` it returns
is handed to the runner (metrics writer, agreed stop, checkpoint hints) and, through the wiring, to the learner
process (`asyncrl.runtime.distributed.group`). Forked children inherit it, board included.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncrl.config import Config, ConfigError, check_experiment_name
from asyncrl.runtime.store.checkpoint import checkpoint_dir, list_checkpoints

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SEED_STRIDE = 100_003  # rank r runs with --seed + r x SEED_STRIDE
STOP_CODES = {"frames": 1, "seconds": 2}  # any other reason (a signal) is 3
STOP_NAMES = {1: "frames", 2: "seconds", 3: "signal"}

# The board: a few float64 words in an anonymous shared mapping, written by the runner and read by its learner
# (ENV_STEPS, EPISODES, REQUEST) or the other way round (the rest).
ENV_STEPS, EPISODES, REQUEST, DECIDED, GROUP_STEPS, GROUP_EPISODES, LOCAL_STEPS_AT, LOCAL_EPISODES_AT = range(8)
BOARD_WORDS = 16


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master: str  # MASTER_ADDR:MASTER_PORT


def rank_from_environ(environ: dict[str, str] | None = None) -> RankInfo | None:
    """The torchrun variables, or None when not launched by torchrun (or with a single rank)."""
    env = os.environ if environ is None else environ
    if not all(name in env for name in ENV_VARS):
        return None
    try:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError("RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers; "
                          "launch with torchrun") from None
    if world < 2:
        return None
    if not 0 <= rank < world or local < 0:
        raise ConfigError(f"RANK {rank} is outside WORLD_SIZE {world}; launch with torchrun")
    return RankInfo(rank, world, local, local_world, f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")


def new_board() -> np.ndarray:
    """The words a rank's runner and learner share (an anonymous shared mapping: forked children see it)."""
    return np.frombuffer(mmap.mmap(-1, 8 * BOARD_WORDS), dtype=np.float64)


@dataclass
class DataParallel:
    """This rank's state, made once by `for_this_rank` and passed to the runner and the learner process."""

    info: RankInfo
    leader_dir: str  # rank 0's run dir: metrics and checkpoints
    timeout: float  # --dist-timeout
    train: bool
    board: np.ndarray = field(default_factory=new_board)
    requested: str | None = None  # this rank's wish to stop, not yet agreed by the group
    requested_at: float = 0.0

    @property
    def follower(self) -> bool:
        """A rank > 0: it keeps no metrics and no checkpoints of its own."""
        return self.info.rank > 0

    def announce(self, cfg: Config) -> None:
        """Say where this rank sits, then start every line this process (and its children) prints with it."""
        info, w = self.info, self.info.world_size
        prefix_output(f"[rank {info.rank}] ")
        print(f"asyncrl: rank {info.rank} of {w} (local rank {info.local_rank}, device {cfg.device}, seed {cfg.seed}, "
              f"master {info.master}) | per rank: {cfg.workers} workers x {cfg.envs_per_worker} envs, batch "
              f"{cfg.batch_size} | group: {w * cfg.workers} workers, {w * cfg.workers * cfg.envs_per_worker} envs, "
              f"{w * cfg.batch_size} samples per update | metrics and checkpoints: {self.leader_dir}", flush=True)

    def metrics_writer(self, run_dir: str, sinks: Callable[[], Sequence[Any]] = tuple) -> Any:
        """The runner's metrics writer: rank 0 writes group totals (to the extra `sinks()` too, e.g. W&B), the
        others nothing."""
        if self.follower:
            return _NoMetrics()
        from asyncrl.diagnostics.metrics import MetricsWriter

        return _GroupMetrics(MetricsWriter(run_dir, sinks()), self)

    def group_stop(self, stop_reason: str | None, totals: Any) -> str | None:
        """Called by the runner's loop: turn this rank's wish to stop into a request to the group, and stop only
        when the learners have agreed (all ranks then stop after the same update).

        Publishes this rank's env steps and episodes for the learners' next agreement. Without training there is
        no update to agree at, and a group that has not agreed within --dist-timeout is broken: both stop at once,
        and so does SIGTERM (torchrun sends it when it tears the group down because a rank failed; Ctrl-C is
        SIGINT).
        """
        board = self.board
        board[ENV_STEPS], board[EPISODES] = totals.env_steps, totals.episodes
        decided = int(board[DECIDED])
        if decided:
            return f"{STOP_NAMES.get(decided, 'signal')}, agreed by all {self.info.world_size} ranks"
        if stop_reason is not None and self.requested is None:
            self.requested, self.requested_at = stop_reason, time.monotonic()
            board[REQUEST] = STOP_CODES.get(stop_reason, 3)
        if self.requested is None:
            return None
        if self.requested == "SIGTERM" or not self.train or time.monotonic() - self.requested_at > self.timeout:
            return self.requested
        return None

    def checkpoint_hint(self, _final: dict | None = None) -> str:
        """Which of rank 0's checkpoints remains (a rank > 0 keeps none: its error lines point at rank 0's)."""
        return leader_checkpoint_hint(self.leader_dir)


def for_this_rank(cfg: Config, environ: dict[str, str] | None = None) -> tuple[Config, DataParallel | None]:
    """Under torchrun: this rank's settings (a new Config, for validation) and its state; else `(cfg, None)`.

    The defaults of --workers and --learner-threads divide the node's usable cores by its ranks themselves
    (`asyncrl.runtime.host.cpus`).
    """
    info = rank_from_environ(environ)
    if info is None:
        return cfg, None
    ranked = rank_settings(cfg, info)
    return ranked, DataParallel(info, cfg.run_dir, ranked.dist_timeout, ranked.train)


def rank_settings(cfg: Config, info: RankInfo) -> Config:
    """`cfg` for rank `info.rank`: seed + rank x SEED_STRIDE, the rank's device, and for a rank > 0 the run dir
    `RUN_DIR/rank<k>` (as train dir RUN_DIR, experiment `rank<k>`) without --resume (rank 0 loads the checkpoint
    and broadcasts it)."""
    if not cfg.dist_timeout > 0:
        raise ConfigError(f"--dist-timeout must be positive (got {cfg.dist_timeout})")
    changes: dict[str, Any] = {"seed": cfg.seed + SEED_STRIDE * info.rank,
                               "device": rank_device(cfg.device, info.local_rank)}
    if info.rank:
        check_experiment_name(cfg.experiment)  # the name as given (validation sees `rank<k>`)
        changes.update(train_dir=cfg.run_dir, experiment=f"rank{info.rank}", resume=False)
    return dataclasses.replace(cfg, **changes)


def rank_device(device: str, local_rank: int) -> str:
    """This rank's device: `cuda:LOCAL_RANK` for --device cuda (and for auto where CUDA exists), else cpu.

    Any other value is left for validation to refuse, and so is cuda on a node without CUDA (the launcher's
    CUDA check names it)."""
    if device not in ("auto", "cuda") and not device.startswith("cuda:"):
        return device  # cpu, or a value validation refuses
    if device.startswith("cuda:"):
        raise ConfigError(f"--device {device}: under torchrun every rank uses cuda:LOCAL_RANK; pass --device cuda")
    count = _cuda_device_count()
    if count == 0:
        return "cpu" if device == "auto" else device
    if local_rank >= count:
        raise ConfigError(f"local rank {local_rank} needs GPU {local_rank} but this node has {count}; "
                          f"use --nproc-per-node {count} or fewer")
    return f"cuda:{local_rank}"


def _cuda_device_count() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def leader_checkpoint_hint(leader_dir: str) -> str:
    found = list_checkpoints(leader_dir)
    where = f"rank 0's {checkpoint_dir(leader_dir)}"
    if not found:
        return f"No checkpoint had been saved in {where}."
    return (f"The last good checkpoint, {os.path.basename(found[0])}, is kept in {where}; "
            f"relaunch every rank with --resume")


class _NoMetrics:
    """Ranks > 0 write no metrics (rank 0 reports the group)."""

    def write(self, record: dict[str, Any], step: int) -> None:
        pass

    def write_video(self, key: str, gif_path: str | None, video_path: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class _GroupMetrics:
    """Rank 0's metrics: frames, env steps, episodes and fps of the whole group (the last agreement plus what
    this rank did since); `rank0_fps` and `ranks` are added. Returns are rank 0's own episodes."""

    def __init__(self, writer: Any, rank: DataParallel):
        self.writer, self.rank = writer, rank
        self.last: tuple[float, int] | None = None

    def write(self, record: dict[str, Any], step: int) -> None:
        board = self.rank.board
        local = record.get("env_steps")
        if isinstance(local, int) and board[GROUP_STEPS] > 0:
            frameskip = record["frames"] // local if local else 1
            steps = int(board[GROUP_STEPS] + max(0.0, local - board[LOCAL_STEPS_AT]))
            record.update(env_steps=steps, frames=steps * frameskip)
            if isinstance(record.get("episodes"), int):
                since = max(0.0, record["episodes"] - board[LOCAL_EPISODES_AT])
                record["episodes"] = int(board[GROUP_EPISODES] + since)
            now = record.get("time")
            if "fps" in record and isinstance(now, int | float):
                record["rank0_fps"] = record["fps"]
                if self.last is not None and now > self.last[0]:
                    record["fps"] = (steps - self.last[1]) * frameskip / (now - self.last[0])
                    record["sps"] = record["fps"] / frameskip
                self.last = (now, steps)
            step = record["frames"]
        record["ranks"] = self.rank.info.world_size
        self.writer.write(record, step)

    def write_video(self, key: str, gif_path: str | None, video_path: str, step: int) -> None:
        self.writer.write_video(key, gif_path, video_path, step)

    def close(self) -> None:
        self.writer.close()


def prefix_output(prefix: str) -> None:
    """Start every line this process (and its forked children) prints with `prefix`."""
    sys.stdout = _Prefixed(sys.stdout, prefix)
    sys.stderr = _Prefixed(sys.stderr, prefix)


class _Prefixed:
    def __init__(self, stream: Any, prefix: str):
        self._stream, self._prefix, self._line_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            pieces.append(self._prefix + piece if self._line_start else piece)
            self._line_start = piece.endswith("\n")
        self._stream.write("".join(pieces))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
