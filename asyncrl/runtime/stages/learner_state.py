"""The learner's state around the learner stage: this process's torch set-up, resuming from a checkpoint, saving
one, and the stop on non-finite updates. Used alike by the forked learner process and the serial loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from asyncrl.agents.base import Learner
from asyncrl.agents.batch import Batch
from asyncrl.config import Config, member_config, member_settings
from asyncrl.models.obs import obs_tensors
from asyncrl.runtime.host.cpus import default_learner_threads
from asyncrl.runtime.host.devices import configure_cuda_backends, resolve_device
from asyncrl.runtime.host.seeding import make_deterministic, seed_learner
from asyncrl.runtime.store.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint

NONFINITE_LIMIT = 5  # consecutive optimizer steps with a NaN/Inf loss or gradient before the run stops


def learner_threads(cfg: Config, device: torch.device, batched: bool = False) -> int:
    """--learner-threads, or for 0 the usable cores' share of this rank (a few on CUDA: `asyncrl.runtime.host.cpus`).

    On the CPU the learner leaves one core per policy worker: its OpenMP threads beside busy workers wait on each
    other at every op (2 threads trained Pong 4.8-10x and the README's CartPole 1.5x slower than 1). A compiled
    learner with a `batched` env (a VectorEnv per split, the update nearly all of the work) takes every core: its
    update scales with threads (at 4,096 CartPole envs, against the eager default, x1.63 with 2 threads and x1.14
    with 1 on a busy machine; x1.42 with 2 on a quiet one: docs/performance.md)."""
    if cfg.deterministic:
        return 1
    if cfg.learner_threads:
        return cfg.learner_threads
    if batched and device.type == "cpu" and cfg.compile in ("learner", "all"):
        return default_learner_threads(device.type, 0)
    return default_learner_threads(device.type, cfg.policy_workers)


def read_resume_state(run_dir: str, warn) -> tuple[str, dict]:
    """(path, state) of the newest good checkpoint, loaded on the CPU whatever the learner's device.

    `load_state_dict` then places each tensor: weights and Adam's moments on the parameters' device, Adam's
    `step` counters on the CPU (where a non-capturable Adam keeps them), and the RNG states stay the CPU byte
    tensors `torch.set_rng_state` takes. Mapping the checkpoint onto a GPU would move all of them there.
    """
    return load_latest_checkpoint(run_dir, map_location="cpu", set_aside=True, warn=warn)


def set_up_torch(cfg: Config, batched: bool = False) -> torch.device:
    """This process's device, threads (`learner_threads`), determinism, CUDA backends and seeds (initial weights
    and minibatch order; a resume restores the saved generators)."""
    device = resolve_device(cfg.device)
    torch.set_num_threads(learner_threads(cfg, device, batched))
    if cfg.deterministic:
        make_deterministic()
    configure_cuda_backends(device, cfg.deterministic)
    seed_learner(cfg.seed)
    return device


class ResumeError(RuntimeError):
    """--resume found no checkpoint that loads into this learner (one line for the user)."""


class Resumed(NamedTuple):
    """What a resume takes from the checkpoint besides the learners' own state."""

    path: str
    env_steps: int
    run: dict  # the runner's counters (elapsed time, episodes, restarts)
    pool: dict | None  # --self-play's snapshot pool (`SnapshotPool.state`), None when the run kept none


def load_resume_state(cfg: Config, learner: Learner | list[Learner], warn: Callable[[str], None]) -> Resumed:
    """Load the run's newest good checkpoint into `learner` (or each policy's learner, in order). ResumeError when
    there is none or it does not fit the model; `warn` hears of corrupt ones skipped."""
    learners = learner if isinstance(learner, list) else [learner]
    try:
        path, state = read_resume_state(cfg.run_dir, warn)
    except CheckpointError as exc:
        raise ResumeError(str(exc)) from None
    saved = [state["learner"], *state.get("policies", [])]
    if len(saved) != len(learners):
        raise ResumeError(f"checkpoint {path} holds {len(saved)} policies and this run has {len(learners)}; resume "
                          f"with --num-policies {len(saved)} or start a new --experiment")
    try:
        for member, member_state in zip(learners, saved):
            member.load_state_dict(member_state)
        for member, settings in zip(learners, state.get("policy_settings", [])):
            member.retune(member_config(member.cfg, settings))  # where PBT had taken each policy
    except (KeyError, RuntimeError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ResumeError(f"checkpoint {path} does not fit this model ({reason}); resume with the settings it was "
                          f"trained with or start a new --experiment") from None
    return Resumed(path, int(state["env_steps"]), dict(state.get("run", {})), state.get("self_play_pool"))


NOT_FINITE_SAVE = "not saving a checkpoint: the weights are not finite"


def save_learner(cfg: Config, learner: Learner | list[Learner], tensors: list[torch.Tensor], steps: int,
                 run: dict, pool: dict | None = None) -> str | None:
    """Checkpoint `learner` (or each policy's, in order) at `steps` env steps with the runner's counters `run`
    (and --self-play's `pool`): the path, or None (nothing written) when the published `tensors` are not finite.
    OSError when the write fails. Policy 0 is `learner`, the others `policies`, their current settings
    `policy_settings`."""
    learners = learner if isinstance(learner, list) else [learner]
    if not all(torch.isfinite(t).all() for t in tensors):
        return None
    population = {} if len(learners) == 1 else {
        "policies": [m.state_dict() for m in learners[1:]],
        "policy_settings": [member_settings(m.cfg) for m in learners]}
    return save_checkpoint(cfg.run_dir, learners[0].version, {
        "learner": learners[0].state_dict(), "env_steps": steps, "config": cfg.to_json(), "env": cfg.env,
        "run": run, **population, **({} if pool is None else {"self_play_pool": pool})}, cfg.keep_checkpoints)


def save_failed_message(cfg: Config, exc: OSError) -> str:
    return f"could not save a checkpoint in {cfg.run_dir}/checkpoints: {exc.strerror or exc}"


def nonfinite_message(learner: Learner, batch: Batch) -> str:
    """Why the run stops after `NONFINITE_LIMIT` skipped optimizer steps, and what to try (one line)."""
    bad = [n for n in ("rewards", "obs")
           if not all(torch.isfinite(x.float()).all() for x in obs_tensors(getattr(batch, n)))]
    cause = f"the env produced non-finite {' and '.join(bad)}" if bad else "training diverged"
    return (f"{learner.nonfinite_streak} optimizer steps in a row had a NaN/Inf loss or gradient ({cause}); "
            f"stopped. Fix: check the env's rewards and observations, lower --lr, keep --max-grad-norm, try "
            f"--normalize-obs.")




def try_save(cfg: Config, learners: list[Learner], tensors: list[torch.Tensor], steps: int, run: dict,
             pool: dict | None = None) -> tuple[str, dict]:
    """Save a checkpoint, never raising: ("saved", {version, env_steps, path}), ("save_failed", {message}) when the
    write failed (training goes on, older checkpoints stay) or ("warning", {message}) for non-finite weights."""
    try:
        path = save_learner(cfg, learners, tensors, steps, run, pool=pool)
    except OSError as exc:  # full disk, unwritable dir
        return "save_failed", {"message": save_failed_message(cfg, exc)}
    if path is None:
        return "warning", {"message": NOT_FINITE_SAVE}
    return "saved", {"version": learners[0].version, "env_steps": steps, "path": path}
