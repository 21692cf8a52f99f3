"""Learner process: feeds full trajectory slots to the learner that `--algo` names and publishes its policy.

Process loop: take `trajectories_per_batch` full slot indices, copy the slots out of shared memory (then
hand the slots straight back to the rollout workers), `train` on them, then publish the learner's
`policy_module()` as its new policy version; also checkpoints, resume and the stop on non-finite updates.
What an update does is the learner's own business (`asyncrl.learners`); this file is only process plumbing.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.learners.base import Learner
from asyncrl.learners.batch import Batch, gather_batch
from asyncrl.learners.registry import make_learner
from asyncrl.models.actor_critic import flat_state
from asyncrl.models.obs import obs_tensors
from asyncrl.runtime import distributed
from asyncrl.runtime.channels import Channels, Empty, Full, report
from asyncrl.runtime.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from asyncrl.runtime.cpus import default_learner_threads
from asyncrl.runtime.devices import configure_cuda_backends, resolve_device
from asyncrl.runtime.process import init_child
from asyncrl.runtime.seeding import make_deterministic, seed_learner, write_initial_weights_checksum
from asyncrl.runtime.shared import SharedArrays, SharedWeights

NONFINITE_LIMIT = 5  # consecutive optimizer steps with a NaN/Inf loss or gradient before the run stops


class WeightsPublisher:
    """Flattens the model's float tensors into the shared weights buffer after every optimizer step."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights):
        self.tensors = flat_state(model)
        numel = sum(t.numel() for t in self.tensors)
        self.weights = weights
        self.shared = weights.allocate(numel)
        self.staging = torch.empty(numel, dtype=torch.float32)

    def publish(self, version: int) -> None:
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                self.staging[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
                offset += t.numel()
        self.weights.publish(self.staging.numpy(), version)


def learner_threads(cfg: Config, device: torch.device) -> int:
    """--learner-threads, or for 0 the usable cores' share of this rank (a few on CUDA: `asyncrl.runtime.cpus`)."""
    if cfg.deterministic:
        return 1
    if cfg.learner_threads:
        return cfg.learner_threads
    return default_learner_threads(device.type, cfg.policy_workers)


def read_resume_state(run_dir: str, warn) -> tuple[str, dict]:
    """(path, state) of the newest good checkpoint, loaded on the CPU whatever the learner's device.

    `load_state_dict` then places each tensor: weights and Adam's moments on the parameters' device, Adam's
    `step` counters on the CPU (where a non-capturable Adam keeps them), and the RNG states stay the CPU byte
    tensors `torch.set_rng_state` takes. Mapping the checkpoint onto a GPU would move all of them there.
    """
    return load_latest_checkpoint(run_dir, map_location="cpu", set_aside=True, warn=warn)


def run_learner(cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: SharedWeights,
                channels: Channels) -> None:
    init_child("asyncrl-learner")
    device = resolve_device(cfg.device)
    torch.set_num_threads(learner_threads(cfg, device))
    if cfg.deterministic:
        make_deterministic()
    configure_cuda_backends(device, cfg.deterministic)
    seed_learner(cfg.seed)  # initial weights and minibatch order (a resume restores the saved generators)
    learner = make_learner(cfg, spec, device)
    learner.sync_gradients = distributed.sync_gradients  # data-parallel hook (torchrun): average over the ranks
    learner.agree_updates = distributed.agree_min  # off-policy learners: the same update count on every rank
    env_steps = 0
    run_state: dict = {}  # the runner's counters (elapsed time, episodes, restarts), kept with each checkpoint
    if cfg.resume:
        try:
            path, state = read_resume_state(cfg.run_dir, lambda msg: report(channels, "warning", 0, {"message": msg}))
        except CheckpointError as exc:
            return _fatal(channels, {"message": str(exc), "hint": False})
        try:
            learner.load_state_dict(state["learner"])
        except (KeyError, RuntimeError, ValueError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return _fatal(channels, {"message": f"checkpoint {path} does not fit this model ({reason}); resume "
                                                f"with the settings it was trained with or start a new --experiment",
                                     "hint": False})
        env_steps = int(state["env_steps"])
        run_state = dict(state.get("run", {}))
        report(channels, "info", 0, {"message": f"resumed from {path}"})
    distributed.join_group(learner, channels)  # data-parallel hook (torchrun): take rank 0's state
    publisher = WeightsPublisher(learner.policy_module(), weights)
    learner.version = max(learner.version, 1)
    publisher.publish(learner.version)
    if not cfg.resume:
        try:
            write_initial_weights_checksum(cfg.run_dir, publisher.staging.numpy())
        except OSError:
            pass  # only a record for comparing runs; the run itself does not need it
    report(channels, "ready", 0, {"version": learner.version, "env_steps": env_steps, "run": run_state,
                                  "stats": list(learner.stat_names)})
    beat = channels.live["beat_learner"]
    if hasattr(learner, "heartbeat"):  # learners with long train() calls (replay, high UTD) show progress inside
        learner.heartbeat = lambda: beat.__setitem__(0, time.monotonic())

    def save(steps: int, run: dict) -> None:
        if not all(torch.isfinite(t).all() for t in publisher.tensors):
            report(channels, "warning", 0, {"message": "not saving a checkpoint: the weights are not finite"})
            return
        try:
            path = save_checkpoint(cfg.run_dir, learner.version, {
                "learner": learner.state_dict(), "env_steps": steps, "config": cfg.to_json(), "env": cfg.env,
                "run": run}, cfg.keep_checkpoints)
        except OSError as exc:  # full disk, unwritable dir: training goes on, the older checkpoints stay
            report(channels, "save_failed", 0, {"message": f"could not save a checkpoint in {cfg.run_dir}/"
                                                           f"checkpoints: {exc.strerror or exc}"})
            return
        report(channels, "saved", 0, {"version": learner.version, "env_steps": steps, "path": path})

    save = distributed.wrap_save(save)  # data-parallel hook (torchrun): only rank 0 saves, with group totals

    k = cfg.trajectories_per_batch
    collected = env_steps  # env steps in the batches taken so far (in lockstep, every step the workers made)
    pending: list[int] = []
    t_wait, fed = 0.0, False
    while True:
        beat[0] = time.monotonic()
        command = _next_command(channels)
        if command is not None:
            name, steps, *extra = command
            env_steps = max(env_steps, steps)
            save(env_steps, extra[0] if extra else {})
            if name == "stop":
                return
        if channels.stopping:
            continue  # the runner's stop command (with the final env-step count) follows
        t0 = time.monotonic()
        try:
            pending.extend(channels.full.get_many(timeout=0.05, max_messages_to_get=k - len(pending)))
        except Empty:
            t_wait += (time.monotonic() - t0) if fed else 0.0  # before the first trajectory: start-up, not a stage
            continue
        t_wait += (time.monotonic() - t0) if fed else 0.0
        fed = True
        if len(pending) < k:
            continue
        if not cfg.train:  # sampling-only run: recycle the trajectories untouched
            channels.free.put_many(pending)
            report(channels, "learner", 0, {"samples": len(pending) * cfg.rollout * cfg.envs_per_split,
                                            "t_wait": t_wait, "t_copy": 0.0, "t_train": 0.0})
            pending, t_wait = [], 0.0
            continue
        t1 = time.monotonic()
        slots = np.asarray(pending, dtype=np.int64)
        batch = gather_batch(traj, slots, learner.version, device)
        if not cfg.deterministic:  # hand the slots straight back; in lockstep only after publishing (below)
            channels.free.put_many(pending)
        t2 = time.monotonic()
        frames = learner.samples_trained * spec.frameskip
        stats = learner.train(batch, frames)
        distributed.after_update(learner, stats, channels)  # data-parallel hook (torchrun): counters, stop
        publisher.publish(learner.version)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t3 = time.monotonic()
        stats.update(t_wait=t_wait, t_copy=t2 - t1, t_train=t3 - t2)
        t_wait = 0.0
        report(channels, "learner", 0, stats)
        collected += batch.rewards.numel()
        if cfg.deterministic and not (cfg.frames and collected * spec.frameskip >= cfg.frames):
            # Lockstep: the next batch is collected by the version just published, and its rollout reports reach
            # the runner after this update's report. At --frames the slots are kept, so no update follows the
            # one the runner stops on and the final checkpoint is the same in every run.
            channels.free.put_many(pending)
        pending = []
        if learner.nonfinite_streak >= NONFINITE_LIMIT:
            _stop_nonfinite(channels, learner, batch)
            return _final_save(channels, save)


def _stop_nonfinite(channels: Channels, learner: Learner, batch: Batch) -> None:
    """Report the divergence as fatal. The skipped steps left the weights as they were, so the final save at the
    runner's stop keeps them (`save` refuses non-finite weights)."""
    bad = [n for n in ("rewards", "obs")
           if not all(torch.isfinite(x.float()).all() for x in obs_tensors(getattr(batch, n)))]
    cause = f"the env produced non-finite {' and '.join(bad)}" if bad else "training diverged"
    message = (f"{learner.nonfinite_streak} optimizer steps in a row had a NaN/Inf loss or gradient ({cause}); "
               f"stopped. Fix: check the env's rewards and observations, lower --lr, keep --max-grad-norm, try "
               f"--normalize-obs.")
    _fatal(channels, {"message": message, "code": "nonfinite"})


def _fatal(channels: Channels, payload: dict) -> None:
    """Report a fatal error, then wait for the runner's stop: exiting at once could make the runner see a dead
    learner ("exited unexpectedly") before it reads the message."""
    try:
        channels.reports.put(("fatal", 0, time.time(), payload), timeout=10)  # unlike report(): never dropped
    except Full:
        return  # the runner is not reading; it will find this process gone
    while not channels.stopping:
        time.sleep(0.05)


def _final_save(channels: Channels, save, timeout: float = 5.0) -> None:
    """After a fatal report: serve the runner's stop command (a final checkpoint if the weights are finite)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        command = _next_command(channels)
        if command is not None and command[0] == "stop":
            _, steps, *extra = command
            save(steps, extra[0] if extra else {})
            return
        time.sleep(0.02)


def _next_command(channels: Channels) -> tuple[str, int] | None:
    try:
        return channels.learner_cmds.get(block=False)
    except Empty:
        return None
