"""Data-parallel learners over torch.distributed, for runs launched by torchrun.

Every rank is a whole asyncrl run (runner, rollout workers, policy workers, learner) on its own share of the
envs; `--workers` and `--envs-per-worker` are per rank. Only the learners form a process group (the runner
never imports torch): gloo on CPU, NCCL on CUDA. The learners

* start from rank 0's weights and optimizer state (broadcast after init or `--resume`; only rank 0 loads);
* average their gradients in one flat bucket every optimizer step, with a "loss is finite" flag in the same
  bucket, so every rank applies or skips the same step;
* agree once per update, in one small all-reduce, on the run's counters (env steps and episodes summed over the
  ranks, trained samples for the learning-rate schedule, the kl schedule's rate), on the running moments of the
  observation (and return) normalisers, pooled exactly over every rank's samples (`asyncrl.algo.moment_sync`),
  and on stopping, so every rank does the same number of updates and policy versions stay in lockstep.

Only rank 0 writes `metrics.jsonl`, TensorBoard and checkpoints; ranks > 0 use `RUN_DIR/rank<k>` for their own
files. A rank whose learner dies makes the others' collectives fail at once (gloo) or after `--dist-timeout`
seconds (a hung rank, NCCL); their learners report it as fatal and each runner stops.

The hooks below are called from the runner, the CLI and the learner; each is a no-op outside torchrun.
Runner side (no torch): `configure`, `metrics_writer`, `group_stop`. Learner side: `join_group`,
`sync_gradients`, `after_update`, `wrap_save`.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from asyncrl.config import Config, ConfigError
from asyncrl.runtime.checkpoint import checkpoint_dir, list_checkpoints

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SEED_STRIDE = 100_003  # rank r runs with --seed + r x SEED_STRIDE
JOIN_TIMEOUT_S = 180.0  # joining waits for every rank's learner to start (importing torch on a loaded machine)
WAIT_FOR_STOP_S = 30.0
CHECKSUMS_ENV = "ASYNCRL_DIST_CHECKSUMS"  # set to 1: each learner appends its parameter checksum per update
CHECKSUMS_FILE = "param_checksums.jsonl"
RNG_KEYS = ("torch_rng", "cuda_rng", "numpy_rng", "python_rng")  # each rank keeps its own generators
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


@dataclass
class _Rank:
    """This rank's state in the runner; forked children inherit it."""

    info: RankInfo
    leader_dir: str  # rank 0's run dir: metrics and checkpoints
    board: np.ndarray
    timeout: float
    train: bool
    requested: str | None = None
    requested_at: float = 0.0


_RANK: _Rank | None = None
_GROUP: _Group | None = None


# ----- runner side (no torch) -----
def configure(cfg: Config) -> RankInfo | None:
    """Under torchrun: adapt `cfg` to this rank (seed, device, run dir) and say so. The defaults of --workers and
    --learner-threads divide the node's usable cores by its ranks themselves (`asyncrl.runtime.cpus`).

    Called by the CLI before the runner starts; returns None (and changes nothing) otherwise.
    """
    global _RANK
    info = rank_from_environ()
    if info is None:
        return None
    if not cfg.dist_timeout > 0:
        raise ConfigError(f"--dist-timeout must be positive (got {cfg.dist_timeout})")
    leader_dir = cfg.run_dir
    cfg.seed += SEED_STRIDE * info.rank
    cfg.device = rank_device(cfg.device, info.local_rank)
    if info.rank:
        cfg.experiment = f"{cfg.experiment_name}/rank{info.rank}"
        cfg.resume = False  # rank 0 loads the checkpoint and broadcasts it
        _point_checkpoint_hints_at(leader_dir)
    board = np.frombuffer(mmap.mmap(-1, 8 * BOARD_WORDS), dtype=np.float64)
    _RANK = _Rank(info, leader_dir, board, cfg.dist_timeout, cfg.train)
    _prefix_output(f"[rank {info.rank}] ")
    w = info.world_size
    print(f"asyncrl: rank {info.rank} of {w} (local rank {info.local_rank}, device {cfg.device}, seed {cfg.seed}, "
          f"master {info.master}) | per rank: {cfg.workers} workers x {cfg.envs_per_worker} envs, batch "
          f"{cfg.batch_size} | group: {w * cfg.workers} workers, {w * cfg.workers * cfg.envs_per_worker} envs, "
          f"{w * cfg.batch_size} samples per update | metrics and checkpoints: {leader_dir}", flush=True)
    return info


def rank_device(device: str, local_rank: int) -> str:
    """This rank's device: `cuda:LOCAL_RANK` for --device cuda (and for auto where CUDA exists), else cpu."""
    if device == "cpu":
        return device
    if device.startswith("cuda:"):
        raise ConfigError(f"--device {device}: under torchrun every rank uses cuda:LOCAL_RANK; pass --device cuda")
    count = _cuda_device_count()
    if device == "auto" and count == 0:
        return "cpu"
    if local_rank >= count:
        raise ConfigError(f"local rank {local_rank} needs GPU {local_rank} but this node has {count}; "
                          f"use --nproc-per-node {count} or fewer")
    return f"cuda:{local_rank}"


def _cuda_device_count() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


def in_group() -> bool:
    """True under torchrun: the group's totals move with the other ranks even when this rank's do not."""
    return _RANK is not None


def metrics_writer(run_dir: str, sinks: Callable[[], Sequence[Any]] = tuple) -> Any:
    """The runner's metrics writer under torchrun (None otherwise): rank 0 writes group totals (to the extra
    `sinks()` too, e.g. W&B), the others nothing."""
    if _RANK is None:
        return None
    if _RANK.info.rank:
        return _NoMetrics()
    from asyncrl.diagnostics.metrics import MetricsWriter

    return _GroupMetrics(MetricsWriter(run_dir, sinks()), _RANK)


def group_stop(stop_reason: str | None, totals: Any) -> str | None:
    """Called by the runner's loop: turn this rank's wish to stop into a request to the group, and stop only
    when the learners have agreed (all ranks then stop after the same update).

    Publishes this rank's env steps and episodes for the learners' next agreement. Without training there is no
    update to agree at, and a group that has not agreed within --dist-timeout is broken: both stop at once, and so
    does SIGTERM (torchrun sends it when it tears the group down because a rank failed; Ctrl-C is SIGINT).
    """
    rank = _RANK
    if rank is None:
        return stop_reason
    board = rank.board
    board[ENV_STEPS], board[EPISODES] = totals.env_steps, totals.episodes
    decided = int(board[DECIDED])
    if decided:
        return f"{STOP_NAMES.get(decided, 'signal')}, agreed by all {rank.info.world_size} ranks"
    if stop_reason is not None and rank.requested is None:
        rank.requested, rank.requested_at = stop_reason, time.monotonic()
        board[REQUEST] = STOP_CODES.get(stop_reason, 3)
    if rank.requested is None:
        return None
    if rank.requested == "SIGTERM" or not rank.train or time.monotonic() - rank.requested_at > rank.timeout:
        return rank.requested
    return None


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

    def __init__(self, writer: Any, rank: _Rank):
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


def _prefix_output(prefix: str) -> None:
    """Start every line this process (and its forked children) prints with the rank."""
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


def _point_checkpoint_hints_at(leader_dir: str) -> None:
    """A rank > 0 keeps no checkpoints: its error lines point at rank 0's."""
    from asyncrl.runtime import supervisor

    supervisor.Supervisor.checkpoint_hint = lambda _self, _final=None: _checkpoint_hint(leader_dir)


def _checkpoint_hint(leader_dir: str) -> str:
    found = list_checkpoints(leader_dir)
    where = f"rank 0's {checkpoint_dir(leader_dir)}"
    if not found:
        return f"No checkpoint had been saved in {where}."
    return (f"The last good checkpoint, {os.path.basename(found[0])}, is kept in {where}; "
            f"relaunch every rank with --resume")


# ----- learner side -----
def join_group(learner: Any, channels: Any) -> None:
    """Join the learners' process group and take rank 0's learner state (model, optimizer, version, counters).

    Called once the learner exists (and rank 0 has loaded its checkpoint), before the first weights are published.
    """
    global _GROUP
    rank = _RANK
    if rank is None:
        return
    import torch
    import torch.distributed as dist

    info, device = rank.info, learner.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        nccl_error_environment(os.environ)
    try:
        join_timeout = timedelta(seconds=max(JOIN_TIMEOUT_S, rank.timeout))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", rank=info.rank,
                                world_size=info.world_size, timeout=join_timeout)
        state = [_portable(learner.state_dict()) if info.rank == 0 else None]
        dist.broadcast_object_list(state, src=0, device=device if device.type == "cuda" else None)
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=rank.timeout))
    except (RuntimeError, ValueError, OSError) as exc:
        _fatal(channels, f"rank {info.rank}: could not join the {info.world_size}-rank group at {info.master} "
                         f"({_first_line(exc)}); check that every rank was launched with the same torchrun settings")
    if info.rank:
        learner.load_state_dict(state[0])
    _GROUP = _Group(rank, learner, channels, dist, torch)


NCCL_ERROR_ENV = {
    # The learner's all_reduce then waits for the collective on the CPU and raises on an error or after
    # --dist-timeout, so `_Group._lost` names the missing rank; without it the call returns at once and NCCL's
    # watchdog ends the process from another thread, past any handler.
    "TORCH_NCCL_BLOCKING_WAIT": "1",
    # 2 (clean up only): on an error the watchdog aborts the communicators, which wakes the blocked wait with the
    # exception, and leaves the process alive (the default, 3, tears it down without a message of ours).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
}


def nccl_error_environment(environ: dict[str, str]) -> dict[str, str]:
    """Set (where the user has not) the NCCL variables that make a failed collective raise in the learner;
    read when the process group is created. Returns what it set."""
    added = {k: v for k, v in NCCL_ERROR_ENV.items() if k not in environ}
    environ.update(added)
    return added


def sync_gradients(model: Any, loss: Any) -> None:
    """Between `loss.backward()` and gradient clipping: average the gradients over the ranks. A non-finite loss
    on any rank makes every rank's gradients NaN, so all of them skip the step."""
    if _GROUP is not None:
        _GROUP.average_gradients(model, loss)


def agree_min(value: int) -> int:
    """The smallest `value` over the ranks (every rank calls this once per batch): an off-policy learner's
    number of gradient updates, so that every rank enters the same number of gradient all-reduces even when
    their batches held different numbers of valid steps."""
    if _GROUP is None:
        return value
    return _GROUP.min_int(value)


def after_update(learner: Any, stats: dict[str, Any], channels: Any) -> None:
    """After each update, before publishing: agree on counters and on stopping (see the module docstring)."""
    if _GROUP is not None:
        _GROUP.agree(learner, stats, channels)


def wrap_save(save: Callable[[int, dict], None]) -> Callable[[int, dict], None]:
    """The learner's checkpoint function: rank 0 saves the group's env steps and episodes; other ranks save
    nothing."""
    if _RANK is None:
        return save
    if _RANK.info.rank:
        return lambda steps, run: None

    def save_group(steps: int, run: dict) -> None:
        group = _GROUP
        if group is not None:
            steps += group.others_steps
            run = {**run, "episodes": int(run.get("episodes", 0)) + group.others_episodes}
        save(steps, run)

    return save_group


class _Group:
    """The learner's side of the process group."""

    def __init__(self, rank: _Rank, learner: Any, channels: Any, dist: Any, torch: Any):
        self.rank, self.info, self.channels, self.dist, self.torch = rank, rank.info, channels, dist, torch
        self.world = rank.info.world_size
        self.device = learner.device
        self.run_dir = learner.cfg.run_dir
        # The model's parameters and any the learner trains outside it (SAC's temperature: `extra_parameters`).
        self.params = [p for p in learner.model.parameters() if p.requires_grad]
        self.params += [p for p in getattr(learner, "extra_parameters", ()) if p.requires_grad]
        self.bucket = torch.zeros(sum(p.numel() for p in self.params) + 1, dtype=torch.float32, device=self.device)
        # Running moments (observation normaliser, and a return normaliser where the learner has one) are pooled
        # exactly (asyncrl.algo.moment_sync); any other floating-point buffer is averaged.
        from asyncrl.algo.moment_sync import MomentSync, moment_modules

        self.moments = MomentSync(moment_modules(learner.model, getattr(learner, "return_normalizer", None)))
        pooled = {id(b) for m in self.moments.modules for b in m.buffers()}
        self.buffers = [b for b in learner.model.buffers() if b.is_floating_point() and id(b) not in pooled]
        self.base_trained = self.seen_trained = learner.samples_trained
        self.local_trained = 0
        self.others_steps = self.others_episodes = 0
        self.updates = self.calls = 0  # updates agreed; collectives entered
        try:
            self.store = dist.distributed_c10d._get_default_store()
            self.store.set(f"asyncrl/calls/{self.info.rank}", "0")
        except (AttributeError, RuntimeError, ValueError):
            self.store = None
        self.checksums = os.environ.get(CHECKSUMS_ENV, "") not in ("", "0")

    def average_gradients(self, model: Any, loss: Any) -> None:
        torch, bucket = self.torch, self.bucket
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                bucket[offset:offset + n].zero_()
            else:
                bucket[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        bucket[-1].copy_(torch.isfinite(loss.detach()))
        self._collective(bucket)
        scale = torch.where(bucket[-1] == self.world, 1.0 / self.world, float("nan"))
        grads = bucket[:-1].mul_(scale)
        offset = 0
        for p in self.params:
            n = p.numel()
            view = grads[offset:offset + n].view(p.shape)
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            offset += n

    def agree(self, learner: Any, stats: dict[str, Any], channels: Any) -> None:
        torch, board = self.torch, self.rank.board
        steps, episodes, request = float(board[ENV_STEPS]), float(board[EPISODES]), int(board[REQUEST])
        self.local_trained += learner.samples_trained - self.seen_trained
        head = [steps, episodes, float(request == 1), float(request == 2), float(request == 3),
                float(self.local_trained), float(learner.lr)]
        parts = [torch.tensor(head, dtype=torch.float64, device=self.device)]
        parts += [b.detach().reshape(-1).double() for b in self.buffers]
        parts.append(self.moments.delta().to(self.device))
        vector = torch.cat(parts)
        self._collective(vector)
        total = vector[:len(head)].tolist()
        learner.samples_trained = self.seen_trained = self.base_trained + int(total[5])
        learner.lr = total[6] / self.world
        offset = len(head)
        with torch.no_grad():
            for b in self.buffers:
                b.copy_((vector[offset:offset + b.numel()] / self.world).view(b.shape))
                offset += b.numel()
            self.moments.apply(vector[offset:offset + self.moments.size])
        group_steps, group_episodes = int(total[0]), int(total[1])
        board[GROUP_STEPS], board[GROUP_EPISODES] = group_steps, group_episodes
        board[LOCAL_STEPS_AT], board[LOCAL_EPISODES_AT] = steps, episodes
        self.others_steps, self.others_episodes = group_steps - int(steps), group_episodes - int(episodes)
        self.updates += 1
        stats.update(group_env_steps=group_steps, ranks=self.world)
        if self.checksums:
            self._write_checksum(learner)
        cfg = learner.cfg
        out_of_frames = cfg.frames and group_steps * learner.spec.frameskip >= cfg.frames
        decided = 1 if total[2] or out_of_frames else 2 if total[3] else 3 if total[4] else 0
        if decided:  # no more collectives: wait here for this rank's runner to stop the run
            board[DECIDED] = decided
            deadline = time.monotonic() + WAIT_FOR_STOP_S
            while not channels.stopping and time.monotonic() < deadline:
                time.sleep(0.02)

    def min_int(self, value: int) -> int:
        tensor = self.torch.tensor([value], dtype=self.torch.int64, device=self.device)
        self._collective(tensor, self.dist.ReduceOp.MIN)
        return int(tensor.item())

    def _collective(self, tensor: Any, op: Any = None) -> None:
        self._beat()
        try:
            self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM if op is None else op)
        except (RuntimeError, ValueError) as exc:
            self._lost(exc)

    def _beat(self) -> None:
        """Note in the store how many collectives this rank has entered, so one that never arrives can be named."""
        self.calls += 1
        if self.store is not None:
            try:
                self.store.set(f"asyncrl/calls/{self.info.rank}", str(self.calls))
            except (RuntimeError, ValueError):
                self.store = None

    def _ranks_behind(self) -> list[int]:
        """Ranks whose learner has not entered this rank's current collective (best effort: the store may be
        gone too)."""
        if self.store is None:
            return []
        behind = []
        try:
            self.store.set_timeout(timedelta(seconds=2))
            for r in range(self.world):
                if r != self.info.rank and int(self.store.get(f"asyncrl/calls/{r}")) < self.calls:
                    behind.append(r)
        except (RuntimeError, ValueError):
            return behind
        return behind

    def _lost(self, exc: BaseException) -> None:
        behind = self._ranks_behind()
        who = (f"rank {', '.join(map(str, behind))} never reached this all-reduce" if behind
               else "another rank died or stopped answering (its own line names it)")
        _fatal(self.channels, f"rank {self.info.rank} lost the learner group in update {self.updates + 1}: {who} "
                              f"({_first_line(exc)}); stopping. {_checkpoint_hint(self.rank.leader_dir)}")

    def _write_checksum(self, learner: Any) -> None:
        from asyncrl.models.actor_critic import flat_state

        digest = hashlib.sha256()  # the published policy (with its buffers) and every trained parameter
        for t in [*flat_state(learner.policy_module()), *self.params]:
            digest.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        with open(os.path.join(self.run_dir, CHECKSUMS_FILE), "a") as f:
            f.write(json.dumps({"rank": self.info.rank, "version": learner.version,
                                "sha256": digest.hexdigest()}) + "\n")


def _portable(obj: Any) -> Any:
    """The learner state without RNG states (each rank keeps its own), tensors on the CPU."""
    if isinstance(obj, dict):
        return {k: _portable(v) for k, v in obj.items() if k not in RNG_KEYS}
    if isinstance(obj, list | tuple):
        return type(obj)(_portable(v) for v in obj)
    return obj.cpu() if hasattr(obj, "cpu") else obj


def _first_line(exc: BaseException) -> str:
    """The gist of an error: gloo's start with a source location and end with generic advice."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", line).split(". This is typically")[0]
    return line[:200]


def _fatal(channels: Any, message: str) -> None:
    """Report a fatal error to this rank's runner, wait for its stop, then end the learner (quietly if the
    runner is already stopping: a rank that stops on its own makes the others' collectives fail)."""
    if channels.stopping:
        raise SystemExit(1)
    try:
        channels.reports.put(("fatal", 0, time.time(), {"message": message}), timeout=10)
    except Exception:  # the runner is gone or not reading; it will find this process gone
        raise SystemExit(1) from None
    deadline = time.monotonic() + WAIT_FOR_STOP_S
    while not channels.stopping and time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit(1)
