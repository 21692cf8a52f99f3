"""APPO learner: PPO's clipped surrogate on V-trace targets, `epochs` x `minibatches` optimizer steps per batch.

Per batch: mask samples staler than `max_policy_lag` (and steps in which the env raised), bootstrap time-limit
cuts from their final observations, update the observation normaliser after the epochs, then adapt the
learning rate (`--lr-schedule kl`). The maths is in `asyncrl.algo`; the process around it in
`asyncrl.runtime.roles.learner`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from asyncrl.agents.appo.compiled_update import LossSettings, forward_loss
from asyncrl.agents.appo.head import PolicyHead, RecurrentPolicyHead
from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.agents.base import GradientHook, no_gradient_sync, no_heartbeat, same_update_count
from asyncrl.agents.batch import Batch
from asyncrl.agents.compiled import autocast, autocast_dtype, compile_fn, first_call
from asyncrl.agents.eager import Adam
from asyncrl.agents.rng_state import load_rng_state, rng_state
from asyncrl.agents.synthetic import synthetic_batch
from asyncrl.algo.lr_schedule import KL_RANGE, kl_adaptive_lr, linear_lr, warmup_factor
from asyncrl.algo.return_norm import ReturnNormalizer
from asyncrl.algo.value_transform import ValueTransform
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import ActorCritic, RecurrentActorCritic, build_model
from asyncrl.models.obs import map_obs
from asyncrl.models.precision import resolve_precision

CELL = "c"  # the LSTM's cell in a recurrent state (asyncrl.models.cores.LSTMCore)
# |c| beyond this: a cell that has run away (a bounded input with a forget gate below 1 keeps |c| within a few units;
# a forget gate stuck at 1 makes the cell count, tanh(c) stays at +-1 and passes no gradient): core_saturation
SATURATED_CELL = 10.0


def hyperparams(cfg: Config) -> APPOHyperparams:
    return APPOHyperparams(gamma=cfg.gamma, clip_ratio=cfg.clip_ratio, value_coeff=cfg.value_coeff,
                           entropy_coeff=cfg.entropy_coeff, rho_bar=cfg.vtrace_rho, c_bar=cfg.vtrace_c,
                           normalize_advantages=cfg.normalize_advantages, adv_std_floor=cfg.adv_std_floor)


class APPOLearner:
    """APPO: actor-critic, Adam and one update per batch (`epochs` x `minibatches` steps); no processes here.

    Satisfies `asyncrl.agents.base.Learner`; publishes the whole ActorCritic (the policy workers act with it).
    """

    policy_state_key = "model"  # `state_dict()["model"]` is `policy_module()`'s state (checkpoints, best.pt)
    stat_names = ("policy_loss", "value_loss", "entropy", "kl", "grad_norm", "clip_fraction", "policy_lag_mean",
                  "policy_lag_max", "learning_rate", "nonfinite_updates")

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        self.cfg, self.spec, self.device = cfg, spec, device
        self.model = self.build_policy(spec, cfg, device)
        # an LSTM: how many of its cells have run away (health.core_saturated)
        if isinstance(self.model, RecurrentActorCritic) and CELL in self.model.state_layout():
            self.stat_names = (*self.stat_names, "core_saturation")
        if cfg.center_values:
            self.stat_names = (*self.stat_names, "value_offset")
        if spec.has_image:  # NHWC convolutions train ~1.4x faster on CPU (measured), same on GPU
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = Adam(self.model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.hp = hyperparams(cfg)
        self.value_transform = ValueTransform(cfg.value_transform)  # --value-transform symlog: head predicts symlog(V)
        # --normalize-returns: rewards divided by a running RMS of the V-trace targets (pooled across ranks by
        # asyncrl.runtime.distributed.group).
        # On the learner's device, beside the observation normaliser: the ranks pool both in one vector.
        self.return_normalizer = ReturnNormalizer().to(device) if cfg.normalize_returns else None
        # --center-values: added to the value head's output; refitted at every step (agents/appo/loss.py). Under
        # torchrun each rank fits it to its own minibatches.
        self.value_offset = 0.0 if cfg.center_values else None
        self.version = 0
        self.lr = cfg.lr  # the kl schedule's current rate
        self.samples_trained = 0
        self.nonfinite_updates = 0
        self.nonfinite_streak = 0  # consecutive skipped steps; the learner process stops the run after a few
        self.sync_gradients: GradientHook = no_gradient_sync  # the data-parallel hook, set by the learner process
        # The rest of the learner contract: one update per batch, short train() calls, everything trained in model.
        self.agree_updates: Callable[[int], int] = same_update_count
        self.heartbeat: Callable[[], None] = no_heartbeat
        self.extra_parameters: tuple[torch.Tensor, ...] = ()
        # --compile learner|all, or --precision bf16-all: the forward and loss as one pure function (compiled_update)
        self.loss_settings = LossSettings(
            self.hp, self.value_transform, spec.action_shape, keep_targets=cfg.normalize_returns,
            center_values=cfg.center_values, autocast_dtype=autocast_dtype(cfg.precision, device))
        self.compiled = cfg.compile in ("learner", "all")
        self.forward_loss = compile_fn(forward_loss, cfg.compile_mode) if self.compiled else forward_loss

    @staticmethod
    def build_policy(spec: EnvSpec, cfg: Config, device: torch.device) -> ActorCritic:
        """The actor-critic the policy workers act with (the learner trains the same one)."""
        model = build_model(spec, cfg.hidden_size, cfg.normalize_obs, cfg.encoder, cfg.rnn, cfg.rnn_size,
                            cfg.rnn_layers, cfg.activation).to(device)
        model.compute_dtype = resolve_precision(cfg.precision, device, spec.has_image)
        return model

    @staticmethod
    def policy_head(policy: ActorCritic, spec: EnvSpec) -> PolicyHead:
        if isinstance(policy, RecurrentActorCritic):
            return RecurrentPolicyHead(policy, spec).eval()
        return PolicyHead(policy, spec).eval()

    def policy_module(self) -> torch.nn.Module:
        return self.model

    def learning_rate(self, frames: int) -> float:
        """The rate of the next update: --lr-schedule's, scaled by the --lr-warmup ramp."""
        return self._scheduled_lr(frames) * warmup_factor(frames, self.cfg.lr_warmup)

    def _scheduled_lr(self, frames: int) -> float:
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
        # stale: this policy's own steps past the lag bound (another policy's rows, a self-play opponent's, and
        # steps in which the env raised are masked for other reasons)
        past_bound = batch.lag > cfg.max_policy_lag
        stale = int((past_bound if batch.valid is None else past_bound & batch.valid).sum().item())
        n_cols = batch.rewards.shape[1]
        minibatches = min(cfg.minibatches, n_cols)  # one policy's columns of a population's batch can be fewer
        bounds = np.linspace(0, n_cols, minibatches + 1).astype(int)  # equal parts when they divide evenly
        prepared = self._prepared(batch)  # observations normalised and scaled once for every epoch
        with self.model.prepared_input():
            sums, steps = self._epochs(prepared, bounds, minibatches)
        if self.model.obs_normalizer is not None:
            # After the epochs: the batch was acted on with the old statistics, so it is trained on with them.
            self.model.update_obs_normalizer(map_obs(batch.obs, lambda x: x[:-1]), mask.bool())
        self.version += 1
        out = {k: v / max(steps, 1) for k, v in sums.items()}
        if cfg.lr_schedule == "kl" and "kl" in out:
            low, high = KL_RANGE
            self.lr = kl_adaptive_lr(self.lr, out["kl"], cfg.kl_target, cfg.lr * low, cfg.lr * high)
        trained = int(mask.sum().item())
        self.samples_trained += trained
        kept_lag = batch.lag[mask.bool()]
        if batch.initial_state and CELL in batch.initial_state:
            out["core_saturation"] = float((batch.initial_state[CELL].abs() > SATURATED_CELL).float().mean())
        out.update(
            learning_rate=lr, samples=batch.rewards.numel(), dropped_stale=stale,
            policy_lag_mean=float(kept_lag.float().mean()) if trained else 0.0,
            policy_lag_max=int(kept_lag.max()) if trained else 0,
            policy_version=self.version, nonfinite_updates=self.nonfinite_updates,
            truncations=int(batch.truncated.sum()),
            truncations_unbootstrapped=int((batch.truncated & ~batch.has_final()).sum()),
        )
        return out

    def _prepared(self, batch: Batch) -> Batch:
        """`batch` with its observations as the model reads them inside `prepared_input` (`prepare_input`)."""
        return dataclasses.replace(batch, obs=self.model.prepare_input(batch.obs),
                                   final_obs=self.model.prepare_input(batch.final_obs))

    def _epochs(self, batch: Batch, bounds: np.ndarray, minibatches: int) -> tuple[dict[str, float], int]:
        """`epochs` passes of `minibatches` optimizer steps over `batch`: (the steps' summed stats, the steps)."""
        cfg = self.cfg
        # --clip-reference learner: the ratio is taken against the policy as it is now, before this update
        anchor = self._anchor_logp(batch, bounds) if cfg.clip_reference == "learner" else None
        sums: dict[str, float] = {}
        steps = 0
        normalizer = self.return_normalizer
        scale = normalizer.scale if normalizer is not None else 1.0  # held fixed for the whole batch
        for epoch in range(cfg.epochs):
            # The targets of the first epoch (one pass over the batch) feed the running return scale.
            on_targets = normalizer.observer(scale) if normalizer is not None and epoch == 0 else None
            for cols in np.random.permutation(minibatches):
                part = slice(int(bounds[cols]), int(bounds[cols + 1]))
                mb = batch.columns(part)
                mb_mask = mb.trainable(cfg.max_policy_lag)
                stats = self._step(mb, mb_mask, scale, on_targets, None if anchor is None else anchor[:, part])
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                steps += 1
                self.heartbeat()  # a batch of a million samples trains for longer than --hang-timeout
        return sums, steps

    @torch.no_grad()
    def _anchor_logp(self, batch: Batch, bounds: np.ndarray) -> torch.Tensor:
        """[T, B]: log-probs of the batch's actions under the current weights, one minibatch's columns at a time."""
        t = batch.rewards.shape[0]
        out = torch.empty_like(batch.behaviour_logp)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = slice(int(lo), int(hi))
            mb = batch.columns(part)
            with autocast(self.loss_settings.autocast_dtype, self.device):
                if isinstance(self.model, RecurrentActorCritic):
                    policy_out = self._unroll(mb)[0][: t * mb.rewards.shape[1]]
                else:
                    policy_out = self.model.policy_out(map_obs(mb.obs, lambda x: x[:-1].flatten(0, 1)))
            dist = self.model.distribution(policy_out.float())
            logp = dist.log_prob(mb.actions.reshape(-1, *self.spec.action_shape))
            out[:, part] = logp.reshape(t, -1).to(out.dtype)
        return out

    def warm_up(self) -> float | None:
        """With --compile learner|all: compile the update (forward, loss, backward) on a zero minibatch of the run's
        shape, leaving weights, optimizer and generators as they were; its seconds (None: nothing to compile).
        CompileError when torch cannot compile this model."""
        if not self.compiled:
            return None
        cfg = self.cfg
        columns = max(1, cfg.trajectories_per_batch * cfg.envs_per_split // max(cfg.minibatches, 1))
        recurrent = isinstance(self.model, RecurrentActorCritic)  # real minibatches carry their initial states
        mb = self._prepared(synthetic_batch(self.spec, cfg.rollout, columns, self.device,
                                            self.model.state_layout() if recurrent else None))

        def update() -> None:
            anchor = mb.behaviour_logp.clone() if cfg.clip_reference == "learner" else None  # as real minibatches
            loss, _ = self._pure_forward(mb, mb.trainable(cfg.max_policy_lag), 1.0, None, anchor)
            loss.backward()
            self.optimizer.zero_grad(set_to_none=True)

        with self.model.prepared_input():  # as `train` runs the update: the graph real minibatches take
            return first_call("the APPO update", update)

    def _pure_forward(self, mb: Batch, mask: torch.Tensor, reward_scale: float,
                      on_targets: Callable[[torch.Tensor, torch.Tensor], None] | None,
                      anchor_logp: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, stats) through `forward_loss` (compiled with --compile): no Python branch on the data."""
        has_final = mb.has_final()
        final_values = self._final_values(mb, has_final)
        state: dict[str, torch.Tensor] = {}
        if isinstance(self.model, RecurrentActorCritic):
            state = dict(mb.initial_state or self.model.initial_state(mb.rewards.shape[1]))
        offset = torch.tensor(self.value_offset or 0.0, device=mb.rewards.device)
        # Contiguous, as the warm-up's zero batch is: a minibatch's columns are views with the whole batch's
        # strides, and a compiled graph guards on strides (a cold recompile on the first real minibatch otherwise).
        loss, stats, vs, kept = self.forward_loss(*map(_contiguous, (
            self.model, self.loss_settings, mb.obs, mb.actions, mb.behaviour_logp,
            mb.rewards / reward_scale if reward_scale != 1.0 else mb.rewards, mb.terminated, mask,
            mb.cut_without_terminal(), final_values, has_final, offset, mb.first, state, anchor_logp)))
        if on_targets is not None and vs is not None and kept is not None:
            on_targets(vs, kept)
        return loss, stats

    def _pure_path(self, mb: Batch) -> bool:
        """Whether this minibatch goes through `forward_loss`: with --compile learner|all or --precision bf16-all,
        except a recurrent model's rare minibatch with a bootstrapped truncation (the state at the cut is needed)."""
        if not (self.compiled or self.loss_settings.autocast_dtype is not None):
            return False
        return not (isinstance(self.model, RecurrentActorCritic) and bool((mb.final_step >= 0).any()))

    def _step(self, mb: Batch, mask: torch.Tensor, reward_scale: float = 1.0,
              on_targets: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
              anchor_logp: torch.Tensor | None = None) -> dict[str, float]:
        t0 = time.monotonic()
        if self._pure_path(mb):
            loss, stats = self._pure_forward(mb, mask, reward_scale, on_targets, anchor_logp)
        else:
            loss, stats = self._eager_forward(mb, mask, reward_scale, on_targets, anchor_logp)
        self.optimizer.zero_grad(set_to_none=True)
        t1 = time.monotonic()
        loss.backward()
        self.sync_gradients(self.model, loss)  # data-parallel hook (torchrun): average over the ranks
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
        if self.value_offset is not None and finite:
            self.value_offset = out["value_offset"]
        out.update(t_forward=t1 - t0, t_backward=t2 - t1, t_optim=time.monotonic() - t2)
        out["grad_norm"] = float(grad_norm)
        out["loss"] = float(loss.detach())
        return out

    def _eager_forward(self, mb: Batch, mask: torch.Tensor, reward_scale: float,
                       on_targets: Callable[[torch.Tensor, torch.Tensor], None] | None,
                       anchor_logp: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, stats) of one minibatch, eager: the model's own unroll (runs between resets as single RNN calls)."""
        t, b = mb.rewards.shape
        if isinstance(self.model, RecurrentActorCritic):  # re-run the core over each whole trajectory
            policy_out, values, before_reset = self._unroll(mb)
            final_values = self._final_values_recurrent(mb, before_reset)
        else:
            policy_out, values = self.model(map_obs(mb.obs, lambda x: x.flatten(0, 1)))
            values = values.reshape(t + 1, b)
            final_values = None
        # The bootstrap row (x_T) only needs its value; the policy is evaluated on the first T rows.
        dist = self.model.distribution(policy_out[: t * b])
        logp = dist.log_prob(mb.actions.reshape(-1, *self.spec.action_shape)).reshape(t, b)
        entropy = dist.entropy().reshape(t, b)
        has_final = mb.has_final()
        if final_values is None:
            final_values = self._final_values(mb, has_final)
        else:
            final_values = torch.where(has_final, final_values, torch.zeros_like(final_values))
        loss, stats = appo_loss(logp, entropy, values, mb.behaviour_logp, mb.rewards, mb.terminated, mask, self.hp,
                                truncated=mb.cut_without_terminal(),
                                final_values=final_values, has_final=has_final,
                                reward_scale=reward_scale, value_transform=self.value_transform,
                                value_offset=self.value_offset, on_targets=on_targets, anchor_logp=anchor_logp)
        return loss, stats

    def _final_values(self, mb: Batch, has_final: torch.Tensor) -> torch.Tensor:
        """[T, B]: V(final obs) of the current network at each bootstrapped truncation, 0 elsewhere.

        Only the envs that have a final observation are evaluated (usually none), without autograd: like the
        bootstrap value V(x_T), it enters the targets only.
        """
        out = torch.zeros_like(mb.rewards)
        envs = torch.nonzero(mb.final_step >= 0).squeeze(1)
        if len(envs):
            with torch.no_grad():
                _, v = self.model(map_obs(mb.final_obs, lambda x: x[envs]))
            out[mb.final_step[envs], envs] = v.reshape(-1).to(out.dtype)
        return torch.where(has_final, out, torch.zeros_like(out))

    def _unroll(self, mb: Batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """A recurrent model over the minibatch's trajectories (whole env columns), from the state each slot's
        first step acted from (`batch.initial_state`), resetting it where `batch.first` is set: (policy output
        [(T + 1) B, A], values [T + 1, B], the states before each reset). Backpropagates through all T + 1 steps.

        With several epochs the initial states are the behaviour policy's, stored when the slot was collected,
        not recomputed by the current weights: from the second epoch on (and for samples a few updates old) a
        trajectory starts from a slightly stale state (as in Sample Factory and R2D2's stored-state strategy);
        V-trace's importance weights see the log-probs of this re-run, not of the state the actor had.
        """
        cuts = tuple(int(f) + 1 for f in mb.final_step[mb.final_step >= 0].tolist())  # final obs need their state
        state = mb.initial_state or self.model.initial_state(mb.rewards.shape[1])
        policy_out, values, before = self.model.unroll(mb.obs, mb.first, state, cuts)
        return policy_out.flatten(0, 1), values, before

    def _final_values_recurrent(self, mb: Batch, before_reset: dict) -> torch.Tensor:
        """[T, B]: V(final obs) of a recurrent model at each env's bootstrapped truncation (step f): one core step
        on the final observation from the state after step f (before the reset at f + 1); 0 elsewhere."""
        out = torch.zeros_like(mb.rewards)
        envs = torch.nonzero(mb.final_step >= 0).squeeze(1)
        if len(envs):
            steps = mb.final_step[envs]
            with torch.no_grad():
                state = {k: torch.stack([before_reset[int(f) + 1][k][int(e)] for f, e in zip(steps, envs)])
                         for k in self.model.state_layout()}
                _, v, _ = self.model.step(map_obs(mb.final_obs, lambda x: x[envs]), state, None)
            out[steps, envs] = v.reshape(-1).to(out.dtype)
        return out

    def retune(self, cfg: Config) -> None:
        """Train on with `cfg`'s settings from now on (population-based training's explore step)."""
        self.cfg = cfg
        self.hp = hyperparams(cfg)
        self.loss_settings = dataclasses.replace(self.loss_settings, hp=self.hp)
        self.lr = cfg.lr

    def adopt(self, other: APPOLearner) -> None:
        """Take `other`'s weights, optimizer state and normalisers (PBT's exploit step); this learner's version
        moves past both, so every reader picks the new weights up, and its own sample count stays."""
        self.model.load_state_dict(other.model.state_dict())
        self.optimizer.load_state_dict(other.optimizer.state_dict())
        if self.return_normalizer is not None and other.return_normalizer is not None:
            self.return_normalizer.load_state_dict(other.return_normalizer.state_dict())
        if self.value_offset is not None and other.value_offset is not None:
            self.value_offset = other.value_offset
        self.version = max(self.version, other.version) + 1

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "version": self.version, "samples_trained": self.samples_trained, "lr": self.lr, **rng_state(),
            **({"return_normalizer": self.return_normalizer.state_dict()} if self.return_normalizer else {}),
            **({"value_offset": self.value_offset} if self.value_offset is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.samples_trained = int(state.get("samples_trained", 0))
        self.lr = float(state.get("lr", self.cfg.lr))
        if self.return_normalizer is not None and "return_normalizer" in state:
            self.return_normalizer.load_state_dict(state["return_normalizer"])
        if self.value_offset is not None:
            self.value_offset = float(state.get("value_offset", 0.0))
        load_rng_state(state)


def _contiguous(x: Any) -> Any:
    """Tensors (also inside a dict of observations or states) made contiguous; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.contiguous()
    if isinstance(x, dict):
        return {k: _contiguous(v) for k, v in x.items()}
    return x
