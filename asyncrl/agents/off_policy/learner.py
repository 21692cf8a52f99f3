"""What SAC, TD3 and REDQ share behind the learner seam: the published actor, the replay buffer and the UTD rule.

Per `train(batch)`: the batch's valid transitions go into a replay buffer the learner owns (in its own process
memory), then `round(utd x new env steps)` gradient updates run (the fractional remainder carries over), each on
`--sac-batch-size` transitions sampled uniformly or by priority (`--per`). The subclasses supply the update
(`_update`); the maths is in `asyncrl.agents.off_policy.sac_loss`, `td3` and `redq`.

Warm-up: the published actor carries a float buffer `warmup` (1 until the learner has inserted
`--learning-starts` env steps, then 0). It travels with the weights like any parameter, so the policy workers
act uniformly at random over the action bounds until the learner publishes `warmup = 0`; no flag or queue
besides the published weights is involved.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from asyncrl.agents.acting import FeedForward, State
from asyncrl.agents.base import GradientHook, no_gradient_sync, no_heartbeat, same_update_count
from asyncrl.agents.batch import Batch
from asyncrl.agents.eager import Adam
from asyncrl.agents.rng_state import load_rng_state, rng_state
from asyncrl.algo import q_divergence
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.critics import QEnsemble, TanhGaussianActor, polyak_update
from asyncrl.replay.buffer import ReplayBatch, ReplayBuffer
from asyncrl.replay.prioritized import PrioritizedReplay

DEFAULT_UTD = {"sac": 1.0, "td3": 1.0, "redq": 20.0}
Q_CHECK_SAMPLES = 512  # replay transitions the Q-divergence check draws (those with a complete return count)
# The check draws from the newest this-many discount horizons 1 / (1 - gamma) of every env's steps: returns of
# older, worse policies would count the policy's improvement since then as critic overestimation.
Q_CHECK_HORIZONS = 10
MAX_HORIZON = 1000  # gamma = 1


class OffPolicyActor(nn.Module):
    """The acting network the policy workers run: a tanh-Gaussian actor scaled to the Box bounds.

    `act(obs)` samples `a = center + half_range tanh(u)` (always within [low, high]) with its log-prob; with
    `deterministic` (TD3) it takes the mean and adds Gaussian noise of `exploration_noise` half ranges, clipped to
    the bounds (log-prob 0). While the `warmup` buffer is 1 it draws uniform random actions instead.
    `forward(obs)` is the greedy action (the evaluator's `policy_out`).
    """

    def __init__(self, spec: EnvSpec, hidden: int, deterministic: bool = False, exploration_noise: float = 0.0):
        super().__init__()
        box = spec.action_space
        low, high = np.asarray(box.low, np.float32), np.asarray(box.high, np.float32)
        self.net = TanhGaussianActor(int(np.prod(spec.obs_shape)), int(np.prod(box.shape)), low, high,
                                     (hidden, hidden))
        self.register_buffer("warmup", torch.ones(()))  # 1: act uniformly at random (published with the weights)
        self.deterministic = deterministic
        self.exploration_noise = exploration_noise
        self.compute_dtype = torch.float32

    @property
    def low(self) -> torch.Tensor:
        return self.net.center - self.net.half_range

    @property
    def high(self) -> torch.Tensor:
        return self.net.center + self.net.half_range

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(obs, deterministic=True)

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy action `center + half_range tanh(mean)` and its log-prob (the evaluator's greedy episodes)."""
        return self.net(obs, deterministic=True)

    def policy(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training-time action: reparameterised sample (SAC) or the deterministic mean (TD3)."""
        return self.net(obs, deterministic=self.deterministic)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = obs.shape[0]
        if float(self.warmup) > 0.5:
            u = torch.rand(n, *self.net.center.shape, device=obs.device)
            logp = -torch.log(2 * self.net.half_range).sum().expand(n)
            return self.low + 2 * self.net.half_range * u, logp
        return self.explore(obs)

    @torch.no_grad()
    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`act` once the warm-up is over: a tanh-Gaussian sample, or (TD3) the mean plus exploration noise."""
        n = obs.shape[0]
        if self.deterministic:
            action, _ = self.net(obs, deterministic=True)
            noise = torch.randn_like(action) * self.exploration_noise * self.net.half_range
            return torch.maximum(torch.minimum(action + noise, self.high), self.low), torch.zeros(n, device=obs.device)
        action, logp = self.net(obs)
        return torch.maximum(torch.minimum(action, self.high), self.low), logp


class OffPolicyHead(nn.Module, FeedForward):
    """An `OffPolicyActor` as the checkpoint consumers run it (`asyncrl.agents.base.ActingHead`), and an
    `asyncrl.agents.acting.Actor` without state.

    `forward(obs)` (what `asyncrl-export` writes) is the greedy action, already within the action bounds:
    `center + half_range tanh(mean)` (for TD3 the deterministic actor). `actions(obs, sample=True)` acts as the
    policy workers do after the warm-up (`OffPolicyActor.explore`): a tanh-Gaussian sample (SAC, REDQ), or
    the mean plus `--exploration-noise` (TD3), clipped to the bounds.
    """

    output_name = "action"

    def __init__(self, actor: OffPolicyActor, spec: EnvSpec):
        super().__init__()
        self.actor = actor
        self.spec = spec

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.net.greedy(obs)

    def actions(self, obs: torch.Tensor, sample: bool) -> torch.Tensor:
        return self.act(obs, {}, None, greedy=not sample)[0]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """The acting contract: the greedy action (`forward`) or the policy workers' draw after the warm-up."""
        if greedy:
            return self(obs), self.actor.greedy(obs)[1], state
        actions, logp = self.actor.explore(obs)
        return actions, logp, state

    def describe(self) -> dict:
        how = ("the deterministic actor's action (TD3; training adds Gaussian noise of exploration_noise half "
               "ranges)" if self.actor.deterministic else "the tanh of the Gaussian mean (SAC, REDQ; training "
               "samples u ~ N(mean, exp(log_std)) with the actor.net.log_std layer from the weights file)")
        return {"preprocessing": [],
                "output": {"name": self.output_name, "shape": ["N", self.spec.num_actions],
                           "meaning": f"the greedy action center + half_range * tanh(mean), within the action "
                                      f"bounds (the env takes it as is): {how}"}}


class OffPolicyLearner:
    """Replay, UTD and bookkeeping for an actor-critic with `num_critics` Q-networks; subclasses add `_update`.

    Satisfies `asyncrl.agents.base.Learner`; publishes only the actor (`policy_module`).
    """

    num_critics = 2
    target_subset: int | None = None  # critics the target takes the min over (None: all; REDQ: a random 2)
    soft_critic = False  # the critics count an entropy bonus (SAC, REDQ): the Q check adds it to the returns
    deterministic_actor = False
    policy_state_key = "actor"  # `state_dict()["actor"]` is `policy_module()`'s state (checkpoints, best.pt)
    stat_names = ("critic_loss", "actor_loss", "alpha", "q_update_mean", "entropy", "replay_size", "utd_achieved",
                  "sample_age_mean", "sample_lag_mean", "policy_lag_mean", "policy_lag_max", "updates",
                  "updates_total", "q_mean", "q_return_mean", "q_divergence")

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        self.cfg, self.spec, self.device = cfg, spec, device
        self.actor = self.build_policy(spec, cfg, device)
        obs_dim, action_dim = int(np.prod(spec.obs_shape)), int(np.prod(spec.action_shape))
        self.action_dim = action_dim
        self.critic = QEnsemble(obs_dim, action_dim, self.num_critics, (cfg.hidden_size, cfg.hidden_size)).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = Adam(self.actor.parameters(), lr=cfg.lr)
        self.critic_optimizer = Adam(self.critic.parameters(), lr=cfg.lr)
        self.model = nn.ModuleDict({"actor": self.actor, "critic": self.critic})
        self.optimizer = self.critic_optimizer
        buffer = ReplayBuffer(cfg.replay_size, spec.obs_shape, spec.obs_dtype, spec.action_shape, np.float32,
                              segment_len=cfg.rollout)
        self.replay: ReplayBuffer | PrioritizedReplay = PrioritizedReplay(buffer) if cfg.per else buffer
        self.buffer = buffer
        # The acting policy's log-prob of each held transition (soft critics only, 4 bytes a transition), for the
        # entropy bonus of the Q check's returns; laid out as the buffer's [segments, T] per-step fields.
        self.behaviour_logp = np.zeros(buffer.rewards.shape, np.float32) if self.soft_critic else None
        self.rng = np.random.default_rng(cfg.seed)
        self.check_rng = np.random.default_rng([cfg.seed, 1])  # the Q check's draws leave training's stream alone
        self.last_q_check = -math.inf  # monotonic time of the last Q-divergence check (one per report interval)
        horizon = MAX_HORIZON if cfg.gamma >= 1.0 else min(MAX_HORIZON, math.ceil(1.0 / (1.0 - cfg.gamma)))
        self.q_check_window = Q_CHECK_HORIZONS * horizon * cfg.workers * cfg.envs_per_worker
        self.utd = cfg.utd or DEFAULT_UTD.get(cfg.algo, 1.0)
        self.version = 0
        self.lr = cfg.lr
        self.samples_trained = 0
        self.steps_inserted = 0  # valid env steps inserted over the run (kept across a resume)
        self.steps_since_start = 0  # valid env steps inserted once updates had started
        self.updates = 0
        self.update_credit = 0.0  # fractional updates carried to the next batch
        self.held = 0  # valid transitions in this process's buffer (rebuilt empty on resume)
        self.nonfinite_updates = 0
        self.nonfinite_streak = 0
        self._finite = True  # no step of the current update was skipped
        # Called after every gradient update; the learner process sets it to its liveness beat, so that the
        # utd x batch updates of one train() call (1,280 for REDQ's default) do not look like a hang.
        self.heartbeat: Callable[[], None] = no_heartbeat
        self.sync_gradients: GradientHook = no_gradient_sync
        # The updates of one batch as agreed by the data-parallel ranks (their minimum; the rest carries over).
        self.agree_updates: Callable[[int], int] = same_update_count
        self.extra_parameters: tuple[torch.Tensor, ...] = ()  # trained outside `model` (averaged over the ranks)
        self.return_normalizer: torch.nn.Module | None = None  # rewards are not normalised here

    @classmethod
    def build_policy(cls, spec: EnvSpec, cfg: Config, device: torch.device) -> OffPolicyActor:
        return OffPolicyActor(spec, cfg.hidden_size, cls.deterministic_actor, cfg.exploration_noise).to(device)

    @staticmethod
    def policy_head(policy: OffPolicyActor, spec: EnvSpec) -> OffPolicyHead:
        return OffPolicyHead(policy, spec).eval()

    def policy_module(self) -> torch.nn.Module:
        return self.actor

    # --- replay -----------------------------------------------------------------------------------------------
    def insert(self, batch: Batch) -> int:
        """Copy the batch into the replay buffer; transitions that cannot be trained on are made unsampleable.

        Those are steps in which the env raised (`valid` False) and truncations without a final observation (a
        second time-limit cut of one env within a slot). Returns the number of valid transitions inserted.
        """
        has_final = batch.has_final().cpu().numpy()
        t_idx, b_idx = np.nonzero(has_final)
        final_obs = batch.final_obs.cpu().numpy()[b_idx]
        versions = (self.version - batch.lag).cpu().numpy()
        result = self.replay.insert(batch.obs.cpu().numpy(), batch.actions.cpu().numpy(),
                                    batch.rewards.cpu().numpy(), batch.terminated.cpu().numpy(), has_final, versions,
                                    final_obs=final_obs)
        bad = (batch.truncated.cpu().numpy() & ~has_final)
        if batch.valid is not None:
            bad |= ~batch.valid.cpu().numpy()
        if self.behaviour_logp is not None:
            self.behaviour_logp.flat[result.indices] = batch.behaviour_logp.cpu().numpy().T.ravel()
        flat_bad = result.indices[bad.T.ravel()]  # result.indices is segment-major: [B, T]
        if len(flat_bad):
            self.buffer.sampleable.flat[flat_bad] = False
            if isinstance(self.replay, PrioritizedReplay):
                self.replay.tree.update(flat_bad, 0.0)
        n_valid = int(bad.size - bad.sum())
        self.held = min(self.held + n_valid, self.buffer.capacity)
        return n_valid

    def _sample(self) -> tuple[ReplayBatch, dict[str, torch.Tensor]]:
        b = self.replay.sample(self.cfg.sac_batch_size, self.rng)
        dev = self.device
        tensors = {
            "obs": torch.as_tensor(b.obs, device=dev).float(), "actions": torch.as_tensor(b.actions, device=dev),
            "rewards": torch.as_tensor(b.rewards, device=dev),
            "next_obs": torch.as_tensor(b.next_obs, device=dev).float(),
            "terminated": torch.as_tensor(b.terminated, device=dev),
            "weights": None if b.weights is None else torch.as_tensor(b.weights, device=dev),
        }
        return b, tensors

    # --- training ---------------------------------------------------------------------------------------------
    def train(self, batch: Batch, frames: int) -> dict[str, float]:
        """Insert the batch, then `round(utd x new steps)` updates once `--learning-starts` transitions are held."""
        t0 = time.monotonic()
        new = self.insert(batch)
        self.steps_inserted += new
        self.samples_trained += new
        if self.steps_inserted >= self.cfg.learning_starts:
            self.actor.warmup.fill_(0.0)  # published with this version: the policy workers start using the actor
        ready = self.held >= max(self.cfg.learning_starts, 1)
        sums: dict[str, float] = {}
        n_updates = 0
        t_sample = t_update = 0.0
        t1 = time.monotonic()
        if ready:
            counted = max(0, min(new, self.held - self.cfg.learning_starts))  # steps of this batch past the warm-up
            self.steps_since_start += counted
            self.update_credit += self.utd * counted
        n_updates = self.agree_updates(math.floor(self.update_credit + 0.5) if ready else 0)
        if ready:
            self.update_credit -= n_updates
            for _ in range(n_updates):
                ts = time.monotonic()
                sample, tensors = self._sample()
                self._finite = True
                tu = time.monotonic()
                t_sample += tu - ts
                stats, td_abs = self._update(tensors)
                t_update += time.monotonic() - tu
                if self._finite:
                    self.nonfinite_streak = 0
                else:  # an update with any skipped step counts once towards the process's stop rule
                    self.nonfinite_updates += 1
                    self.nonfinite_streak += 1
                if td_abs is not None and isinstance(self.replay, PrioritizedReplay):
                    self.replay.update_priorities(sample.indices, td_abs.cpu().numpy())
                stats["sample_age_mean"] = float(self.buffer.age(sample).mean())
                stats["sample_lag_mean"] = float((self.version - sample.versions).mean())
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
                self.updates += 1
                self.heartbeat()
        self.version += 1
        out = {k: v / n_updates for k, v in sums.items()} if n_updates else {}
        out.update(
            replay_size=self.held, updates=n_updates, updates_total=self.updates, samples=batch.rewards.numel(),
            policy_version=self.version,
            nonfinite_updates=self.nonfinite_updates, truncations=int(batch.truncated.sum()),
            truncations_unbootstrapped=int((batch.truncated & ~batch.has_final()).sum()),
            policy_lag_mean=float(batch.lag.float().mean()), policy_lag_max=int(batch.lag.max()),
            t_insert=t1 - t0, t_sample=t_sample, t_update=t_update,
        )
        if self.steps_since_start:  # left out during the warm-up, so a record's mean is not diluted by zeros
            out["utd_achieved"] = self.updates / self.steps_since_start
        if n_updates and time.monotonic() - self.last_q_check >= self.cfg.report_interval:
            self.last_q_check = time.monotonic()
            out.update(self.q_divergence_stats())
        return out

    @torch.no_grad()
    def q_divergence_stats(self, samples: int = Q_CHECK_SAMPLES) -> dict[str, float]:
        """Critic estimates vs observed discounted returns on replay transitions (`asyncrl.algo.q_divergence`).

        Draws `samples` sampleable transitions uniformly from the newest `q_check_window` (Q_CHECK_HORIZONS
        discount horizons of every env's steps), so that the returns come from a policy close to the one the
        critics value; those whose episode is complete in the buffer (or cut by a time limit far enough ahead)
        give `q_mean`, `q_return_mean` and `q_divergence`; {} when none does.
        """
        buf = self.buffer
        pool = buf.recent_indices(self.q_check_window)
        if not len(pool):
            return {}
        indices = self.check_rng.choice(pool, samples)
        alpha = self.entropy_alpha()
        bonus = None if self.behaviour_logp is None else -alpha * self.behaviour_logp
        returns, complete, boot_index, boot_weight = q_divergence.episode_returns(
            buf.rewards, buf.terminated, buf.truncated, buf.sampleable, buf.next_segment, indices, self.cfg.gamma,
            bonus=bonus)
        if not complete.any():
            return {}
        batch = buf.gather(indices[complete])
        q = self._ensemble_estimate(batch.obs, batch.actions)
        returns, boot_index, boot_weight = returns[complete], boot_index[complete], boot_weight[complete]
        cut = boot_index >= 0
        if cut.any():  # a time-limit cut: bootstrap from the critic's value of the final observation
            final = buf.gather(boot_index[cut])
            action, logp = self.actor.policy(torch.as_tensor(final.next_obs, device=self.device).float())
            value = self._ensemble_estimate(final.next_obs, action)  # the soft value, as the target takes it
            if self.soft_critic:
                value -= alpha * logp.float().cpu().numpy()
            returns[cut] += boot_weight[cut] * value
        return q_divergence.divergence(q, returns)

    def entropy_alpha(self) -> float:
        """The entropy temperature a soft critic's values include (0 without one)."""
        return 0.0

    def _ensemble_estimate(self, obs: np.ndarray, actions: np.ndarray | torch.Tensor) -> np.ndarray:
        q = self.critic(torch.as_tensor(obs, device=self.device).float(), torch.as_tensor(actions, device=self.device))
        return q_divergence.ensemble_estimate(q.float().cpu().numpy(), self.target_subset)

    def _update(self, b: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor | None]:
        """One gradient update on a sampled batch: (stats, |TD error| per sample for prioritized replay)."""
        raise NotImplementedError

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, module: nn.Module) -> bool:
        """Backward and step unless the loss or a gradient is not finite (then counted and skipped).

        The gradients are checked through their norms, one fused op: a NaN or an infinity anywhere makes its
        tensor's norm (and the stack's) non-finite; so would finite gradients whose norm overflows float32."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync_gradients(module, loss)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = bool(torch.isfinite(loss)) and (
            not grads or bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()))
        if not finite:
            self._finite = False
            optimizer.zero_grad(set_to_none=True)
            return False
        optimizer.step()
        return True

    def _soft_update_critic(self) -> None:
        polyak_update(self.critic_target, self.critic, self.cfg.tau)

    # --- checkpoint -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Networks, optimizers and counters; the replay buffer is not saved (a resume refills it)."""
        return {
            "actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "version": self.version, "samples_trained": self.samples_trained, "steps_inserted": self.steps_inserted,
            "steps_since_start": self.steps_since_start, "updates": self.updates,
            "update_credit": self.update_credit, "replay_rng": self.rng.bit_generator.state, **rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.version = int(state["version"])
        self.samples_trained = int(state["samples_trained"])
        self.steps_inserted = int(state["steps_inserted"])
        self.steps_since_start = int(state["steps_since_start"])
        self.updates = int(state["updates"])
        self.update_credit = float(state["update_credit"])
        self.rng.bit_generator.state = state["replay_rng"]
        load_rng_state(state)
