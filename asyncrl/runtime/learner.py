"""Learner: turns complete trajectories into APPO updates and publishes each new policy version.

Process loop: take `trajectories_per_batch` full slot indices, copy the slots out of shared memory (then
hand the slots straight back to the rollout workers), mask samples staler than `max_policy_lag`, run
`epochs` x `minibatches` optimizer steps, then publish the weights as policy version + 1.
The maths is in `asyncrl.algo.appo`; this file is only data movement and bookkeeping.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from asyncrl.algo.appo import APPOHyperparams, appo_loss
from asyncrl.algo.lr_schedule import KL_RANGE, kl_adaptive_lr, linear_lr
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import build_model, flat_state
from asyncrl.runtime import distributed
from asyncrl.runtime.channels import Channels, Empty, Full, report
from asyncrl.runtime.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from asyncrl.runtime.devices import resolve_device, resolve_precision
from asyncrl.runtime.process import init_child
from asyncrl.runtime.seeding import make_deterministic, seed_learner, write_initial_weights_checksum
from asyncrl.runtime.shared import SharedArrays, SharedWeights

NONFINITE_LIMIT = 5  # consecutive optimizer steps with a NaN/Inf loss or gradient before the run stops


@dataclass
class Batch:
    """Time-major training data: T steps x B envs (B = trajectories x envs per split)."""

    obs: torch.Tensor  # [T + 1, B, ...]
    actions: torch.Tensor  # [T, B, ...]
    behaviour_logp: torch.Tensor  # [T, B]
    rewards: torch.Tensor  # [T, B]
    terminated: torch.Tensor  # [T, B] bool: the episode reached a terminal state after step t
    truncated: torch.Tensor  # [T, B] bool: a time limit cut the episode after step t
    final_obs: torch.Tensor  # [B, ...] the observation an env reached at its bootstrapped truncation
    final_step: torch.Tensor  # [B] that truncation's step, -1 when the env has none
    lag: torch.Tensor  # [T, B] learner version - behaviour version
    valid: torch.Tensor | None = None  # [T, B] bool; False where the env raised (None: all valid)

    def columns(self, cols: slice) -> Batch:
        return Batch(**{f: None if (x := getattr(self, f)) is None else x[cols] if f in PER_ENV else x[:, cols]
                        for f in self.__dataclass_fields__})

    def trainable(self, max_policy_lag: int) -> torch.Tensor:
        """The loss mask: fresh enough and not a step in which the env raised."""
        mask = (self.lag <= max_policy_lag).float()
        return mask if self.valid is None else mask * self.valid

    def cut_without_terminal(self) -> torch.Tensor:
        """[T, B] bool: episode ends with a value after them: time-limit cuts, and steps in which the env raised
        (their transition is lost: `asyncrl.algo.time_limits` treats them as cuts without a final observation)."""
        return self.truncated if self.valid is None else self.truncated | ~self.valid

    def has_final(self) -> torch.Tensor:
        """[T, B] bool: truncated steps whose final observation is in `final_obs`."""
        steps = torch.arange(self.rewards.shape[0], device=self.final_step.device).unsqueeze(1)
        return self.truncated & (steps == self.final_step.unsqueeze(0))


PER_ENV = frozenset({"final_obs", "final_step"})  # Batch fields indexed by env only (no time dimension)


def gather_batch(traj: SharedArrays, slots: np.ndarray, version: int, device: torch.device) -> Batch:
    """Copy the given slots out of the shared buffer into time-major tensors on `device`."""

    def time_major(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        x = torch.from_numpy(traj[name][slots])  # [k, T(+1), E, ...] (fancy indexing copies)
        x = x.transpose(0, 1).reshape(x.shape[1], -1, *x.shape[3:])
        x = x.pin_memory() if device.type == "cuda" else x
        return x.to(device, dtype=dtype, non_blocking=True)

    def env_major(name: str) -> torch.Tensor:
        x = torch.from_numpy(traj[name][slots])  # [k, E, ...]
        return x.reshape(-1, *x.shape[2:]).to(device)

    e = traj["obs"].shape[2]
    versions = torch.from_numpy(traj["versions"][slots]).t().repeat_interleave(e, dim=1)  # [T, k*E]
    return Batch(
        obs=time_major("obs"),
        actions=time_major("actions"),
        behaviour_logp=time_major("logp"),
        rewards=time_major("rewards"),
        terminated=time_major("terminated"),
        truncated=time_major("truncated"),
        final_obs=env_major("final_obs"),
        final_step=env_major("final_step"),
        lag=(version - versions).to(device),
        valid=time_major("valid"),
    )


class Learner:
    """Model, optimizer and one update step; no processes or queues here."""

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        self.cfg, self.spec, self.device = cfg, spec, device
        image = len(spec.obs_shape) == 3
        self.model = build_model(spec, cfg.hidden_size, cfg.normalize_obs).to(device)
        self.model.compute_dtype = resolve_precision(cfg.precision, device, image)
        if image:  # NHWC convolutions train ~1.4x faster on CPU (measured), same on GPU
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.hp = APPOHyperparams(
            gamma=cfg.gamma, clip_ratio=cfg.clip_ratio, value_coeff=cfg.value_coeff,
            entropy_coeff=cfg.entropy_coeff, rho_bar=cfg.vtrace_rho, c_bar=cfg.vtrace_c,
            normalize_advantages=cfg.normalize_advantages,
        )
        self.version = 0
        self.lr = cfg.lr  # the kl schedule's current rate
        self.samples_trained = 0
        self.nonfinite_updates = 0
        self.nonfinite_streak = 0  # consecutive skipped steps; NONFINITE_LIMIT of them stop the run

    def learning_rate(self, frames: int) -> float:
        if self.cfg.lr_schedule == "linear" and self.cfg.frames:
            return linear_lr(self.cfg.lr, frames, self.cfg.frames)
        if self.cfg.lr_schedule == "kl":
            return self.lr
        return self.cfg.lr

    def train(self, batch: Batch, frames: int) -> dict[str, float]:
        """One update: `epochs` passes of `minibatches` optimizer steps; the policy version then goes up by 1.

        Lag is counted in updates (batches), so multi-epoch training does not make its own data stale.
        """
        cfg = self.cfg
        lr = self.learning_rate(frames)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        mask = batch.trainable(cfg.max_policy_lag)
        fresh = int((batch.lag <= cfg.max_policy_lag).sum().item())
        n_cols = batch.rewards.shape[1]
        per_mb = n_cols // cfg.minibatches
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(cfg.epochs):
            for cols in np.random.permutation(cfg.minibatches):
                mb = batch.columns(slice(cols * per_mb, (cols + 1) * per_mb))
                mb_mask = mb.trainable(cfg.max_policy_lag)
                stats = self._step(mb, mb_mask)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
        if self.model.obs_normalizer is not None:
            # After the epochs: the batch was acted on with the old statistics, so it is trained on with them.
            self.model.obs_normalizer.update(batch.obs[:-1][mask.bool()])
        self.version += 1
        out = {k: v / max(steps, 1) for k, v in sums.items()}
        if cfg.lr_schedule == "kl" and "kl" in out:
            low, high = KL_RANGE
            self.lr = kl_adaptive_lr(lr, out["kl"], cfg.kl_target, cfg.lr * low, cfg.lr * high)
        trained = int(mask.sum().item())
        self.samples_trained += trained
        kept_lag = batch.lag[mask.bool()]
        out.update(
            learning_rate=lr, samples=batch.rewards.numel(), dropped_stale=batch.rewards.numel() - fresh,
            policy_lag_mean=float(kept_lag.float().mean()) if trained else 0.0,
            policy_lag_max=int(kept_lag.max()) if trained else 0,
            policy_version=self.version, nonfinite_updates=self.nonfinite_updates,
            truncations=int(batch.truncated.sum()),
            truncations_unbootstrapped=int((batch.truncated & ~batch.has_final()).sum()),
        )
        return out

    def _step(self, mb: Batch, mask: torch.Tensor) -> dict[str, float]:
        t, b = mb.rewards.shape
        t0 = time.monotonic()
        policy_out, values = self.model(mb.obs.reshape(-1, *self.spec.obs_shape))
        values = values.reshape(t + 1, b)
        # The bootstrap row (x_T) only needs its value; the policy is evaluated on the first T rows.
        dist = self.model.distribution(policy_out[: t * b])
        logp = dist.log_prob(mb.actions.reshape(-1, *self.spec.action_shape)).reshape(t, b)
        entropy = dist.entropy().reshape(t, b)
        has_final = mb.has_final()
        loss, stats = appo_loss(logp, entropy, values, mb.behaviour_logp, mb.rewards, mb.terminated, mask, self.hp,
                                truncated=mb.cut_without_terminal(),
                                final_values=self._final_values(mb, has_final), has_final=has_final)
        self.optimizer.zero_grad(set_to_none=True)
        t1 = time.monotonic()
        loss.backward()
        distributed.sync_gradients(self.model, loss)  # data-parallel hook (torchrun): average over the ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        finite = bool(torch.isfinite(loss) and torch.isfinite(grad_norm))
        t2 = time.monotonic()
        if not finite:
            self.nonfinite_updates += 1
            self.nonfinite_streak += 1
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.nonfinite_streak = 0
            self.optimizer.step()
        out = {k: float(v) for k, v in stats.items()}
        out.update(t_forward=t1 - t0, t_backward=t2 - t1, t_optim=time.monotonic() - t2)
        out["grad_norm"] = float(grad_norm)
        out["loss"] = float(loss.detach())
        return out

    def _final_values(self, mb: Batch, has_final: torch.Tensor) -> torch.Tensor:
        """[T, B]: V(final obs) of the current network at each bootstrapped truncation, 0 elsewhere.

        Only the envs that have a final observation are evaluated (usually none), without autograd: like the
        bootstrap value V(x_T), it enters the targets only.
        """
        out = torch.zeros_like(mb.rewards)
        envs = torch.nonzero(mb.final_step >= 0).squeeze(1)
        if len(envs):
            with torch.no_grad():
                _, v = self.model(mb.final_obs[envs])
            out[mb.final_step[envs], envs] = v.reshape(-1).to(out.dtype)
        return torch.where(has_final, out, torch.zeros_like(out))

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "version": self.version, "samples_trained": self.samples_trained, "lr": self.lr,
            "torch_rng": torch.get_rng_state(), "numpy_rng": _numpy_rng_state(),
            "python_rng": random.getstate(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.samples_trained = int(state.get("samples_trained", 0))
        self.lr = float(state.get("lr", self.cfg.lr))
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
            np.random.set_state(_numpy_rng_from(state["numpy_rng"]))
            random.setstate(_tuples(state["python_rng"]))


def _numpy_rng_state() -> list:
    """numpy's global RNG state as plain data (no ndarray), so that a checkpoint loads with weights_only."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _numpy_rng_from(saved) -> tuple:
    name, keys, pos, has_gauss, cached = saved
    return name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)


def _tuples(value):
    """random.setstate wants tuples where a round trip may have produced lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


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


def learner_threads(cfg: Config) -> int:
    if cfg.deterministic:
        return 1
    if cfg.learner_threads:
        return cfg.learner_threads
    return max(1, (os.cpu_count() or 1) - cfg.policy_workers)


def run_learner(cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: SharedWeights,
                channels: Channels) -> None:
    init_child("asyncrl-learner")
    torch.set_num_threads(learner_threads(cfg))
    if cfg.deterministic:
        make_deterministic()
    seed_learner(cfg.seed)  # initial weights and minibatch order (a resume restores the saved generators)
    device = resolve_device(cfg.device)
    learner = Learner(cfg, spec, device)
    env_steps = 0
    run_state: dict = {}  # the runner's counters (elapsed time, episodes, restarts), kept with each checkpoint
    if cfg.resume:
        try:
            path, state = load_latest_checkpoint(
                cfg.run_dir, map_location=device, set_aside=True,
                warn=lambda msg: report(channels, "warning", 0, {"message": msg}))
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
    publisher = WeightsPublisher(learner.model, weights)
    learner.version = max(learner.version, 1)
    publisher.publish(learner.version)
    if not cfg.resume:
        try:
            write_initial_weights_checksum(cfg.run_dir, publisher.staging.numpy())
        except OSError:
            pass  # only a record for comparing runs; the run itself does not need it
    report(channels, "ready", 0, {"version": learner.version, "env_steps": env_steps, "run": run_state})
    beat = channels.live["beat_learner"]

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
    t_wait = 0.0
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
            t_wait += time.monotonic() - t0
            continue
        t_wait += time.monotonic() - t0
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
    bad = [n for n in ("rewards", "obs") if not torch.isfinite(getattr(batch, n).float()).all()]
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
