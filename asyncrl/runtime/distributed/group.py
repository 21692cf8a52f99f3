"""The learners' side of a torchrun launch: the process group, joined once per learner process.

`join_group(ranks, learner, channels)` joins the group, takes rank 0's learner state and returns the `Group`
whose methods the learner process hooks in: `average_gradients` (the learner's `sync_gradients`), `min_int`
(its `agree_updates`), `agree` (after each update) and `wrap_save` (its checkpoint function).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from asyncrl.runtime.distributed.rank import (
    DECIDED,
    ENV_STEPS,
    EPISODES,
    GROUP_EPISODES,
    GROUP_STEPS,
    LOCAL_EPISODES_AT,
    LOCAL_STEPS_AT,
    REQUEST,
    DataParallel,
    leader_checkpoint_hint,
)

JOIN_TIMEOUT_S = 180.0  # joining waits for every rank's learner to start (importing torch on a loaded machine)
WAIT_FOR_STOP_S = 30.0
CHECKSUMS_ENV = "ASYNCRL_DIST_CHECKSUMS"  # set to 1: each learner appends its parameter checksum per update
CHECKSUMS_FILE = "param_checksums.jsonl"
RNG_KEYS = ("torch_rng", "cuda_rng", "numpy_rng", "python_rng")  # each rank keeps its own generators


def join_group(ranks: DataParallel, learner: Any, channels: Any) -> Group:
    """Join the learners' process group and take rank 0's learner state (model, optimizer, version, counters).

    Called once the learner exists (and rank 0 has loaded its checkpoint), before the first weights are published.
    """
    import torch
    import torch.distributed as dist

    info, device = ranks.info, learner.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        nccl_error_environment(os.environ)
    try:
        join_timeout = timedelta(seconds=max(JOIN_TIMEOUT_S, ranks.timeout))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", rank=info.rank,
                                world_size=info.world_size, timeout=join_timeout)
        state = [_portable(learner.state_dict()) if info.rank == 0 else None]
        dist.broadcast_object_list(state, src=0, device=device if device.type == "cuda" else None)
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=ranks.timeout))
    except (RuntimeError, ValueError, OSError) as exc:
        _fatal(channels, f"rank {info.rank}: could not join the {info.world_size}-rank group at {info.master} "
                         f"({_first_line(exc)}); check that every rank was launched with the same torchrun settings")
    if info.rank:
        learner.load_state_dict(state[0])
    return Group(ranks, learner, channels, dist, torch)


NCCL_ERROR_ENV = {
    # The learner's all_reduce then waits for the collective on the CPU and raises on an error or after
    # --dist-timeout, so `Group._lost` names the missing rank; without it the call returns at once and NCCL's
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


class Group:
    """The learner's side of the process group: the hooks of one learner process."""

    def __init__(self, ranks: DataParallel, learner: Any, channels: Any, dist: Any, torch: Any):
        self.ranks, self.info, self.channels, self.dist, self.torch = ranks, ranks.info, channels, dist, torch
        self.world = ranks.info.world_size
        self.device = learner.device
        self.run_dir = learner.cfg.run_dir
        # The model's parameters and any the learner trains outside it (SAC's temperature: `extra_parameters`).
        self.params = [p for p in learner.model.parameters() if p.requires_grad]
        self.params += [p for p in learner.extra_parameters if p.requires_grad]
        self.bucket = torch.zeros(sum(p.numel() for p in self.params) + 1, dtype=torch.float32, device=self.device)
        # Running moments (observation normaliser, and a return normaliser where the learner has one) are pooled
        # exactly (asyncrl.algo.moment_sync); any other floating-point buffer is averaged.
        from asyncrl.algo.moment_sync import MomentSync, moment_modules

        self.moments = MomentSync(moment_modules(learner.model, learner.return_normalizer))
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
        """The learner's `sync_gradients`, between `loss.backward()` and gradient clipping: average the gradients
        over the ranks. A non-finite loss on any rank makes every rank's gradients NaN, so all of them skip the
        step."""
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
        """After each update, before publishing: agree on counters and on stopping (see the package docstring)."""
        torch, board = self.torch, self.ranks.board
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
        """The smallest `value` over the ranks (every rank calls this once per batch): the learner's
        `agree_updates`, an off-policy learner's number of gradient updates, so that every rank enters the same
        number of gradient all-reduces even when their batches held different numbers of valid steps."""
        tensor = self.torch.tensor([value], dtype=self.torch.int64, device=self.device)
        self._collective(tensor, self.dist.ReduceOp.MIN)
        return int(tensor.item())

    def wrap_save(self, save: Callable[[int, dict], None]) -> Callable[[int, dict], None]:
        """The learner's checkpoint function: rank 0 saves the group's env steps and episodes; other ranks save
        nothing."""
        if self.info.rank:
            return lambda steps, run: None

        def save_group(steps: int, run: dict) -> None:
            steps += self.others_steps
            run = {**run, "episodes": int(run.get("episodes", 0)) + self.others_episodes}
            save(steps, run)

        return save_group

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
                              f"({_first_line(exc)}); stopping. {leader_checkpoint_hint(self.ranks.leader_dir)}")

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
