"""SAC learner: twin critics, a tanh-Gaussian actor and automatic temperature (Haarnoja et al. 2018).

Per update: critic step on the soft Bellman target (min of the two target critics), actor step, temperature
step towards the entropy target -|A|, Polyak update of the target critics. Replay, UTD and the published actor
are `asyncrl.agents.off_policy.learner`'s; the maths is `asyncrl.agents.off_policy.sac_loss`.
"""

from __future__ import annotations

import torch

from asyncrl.agents.compiled import compile_fn, first_call
from asyncrl.agents.eager import Adam
from asyncrl.agents.off_policy import sac_loss as sac
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.agents.off_policy.sac_compiled import actor_loss_fn, critic_loss_fn
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec


class SACLearner(OffPolicyLearner):
    """Soft Actor-Critic behind the learner seam; REDQ changes the critic count, the target and the actor loss."""

    soft_critic = True

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        super().__init__(cfg, spec, device)
        self.log_alpha = torch.zeros((), device=device, requires_grad=True)
        self.alpha_optimizer = Adam([self.log_alpha], lr=cfg.lr)
        self.extra_parameters = (self.log_alpha,)
        self.entropy_target = sac.target_entropy(self.action_dim)
        self.critic_updates = 0
        self.last_actor_stats = {"actor_loss": 0.0, "entropy": 0.0}
        # --compile learner|all (sac only: REDQ and TD3 change the target and the actor loss)
        self.compiled = cfg.compile in ("learner", "all") and cfg.algo == "sac"
        if self.compiled:
            self.critic_loss_fn = compile_fn(critic_loss_fn, cfg.compile_mode)
            self.actor_loss_fn = compile_fn(actor_loss_fn, cfg.compile_mode)

    def warm_up(self) -> float | None:
        """With --compile: compile both updates (forward and backward) on a zero batch of --sac-batch-size
        transitions, leaving weights, optimizers and generators as they were; its seconds (None: nothing to do)."""
        if not self.compiled:
            return None
        n, dev = self.cfg.sac_batch_size, self.device
        obs = torch.zeros((n, *self.spec.obs_shape), device=dev)
        b = {"obs": obs, "next_obs": obs, "actions": torch.zeros((n, self.action_dim), device=dev),
             "rewards": torch.zeros(n, device=dev), "terminated": torch.zeros(n, dtype=torch.bool, device=dev),
             "weights": torch.ones(n, device=dev) if self.cfg.per else None}

        def both() -> None:
            alpha = self.log_alpha.detach().exp()
            self._critic_loss(b, alpha)[0].backward()
            self.actor_loss_fn(self.actor.net, self.critic, b["obs"], alpha)[0].backward()
            for optimizer in (self.critic_optimizer, self.actor_optimizer):
                optimizer.zero_grad(set_to_none=True)

        return first_call("the SAC update", both)

    def _critic_loss(self, b: dict[str, torch.Tensor], alpha: torch.Tensor,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.critic_loss_fn(self.actor.net, self.critic, self.critic_target, self.cfg.gamma, b["obs"],
                                   b["actions"], b["rewards"], b["terminated"], b["next_obs"], b["weights"], alpha)

    def _compiled_update(self, b: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor | None]:
        """`_update` through the compiled critic and actor losses (sac_compiled), same steps in the same order."""
        alpha = self.log_alpha.detach().exp()
        q_loss, td_abs, q_mean = self._critic_loss(b, alpha)
        self._step(self.critic_optimizer, q_loss, self.critic)
        self.critic_updates += 1
        pi_loss, logp = self.actor_loss_fn(self.actor.net, self.critic, b["obs"], alpha)
        self._step(self.actor_optimizer, pi_loss, self.actor)
        alpha_loss = sac.temperature_loss(self.log_alpha, logp, self.entropy_target)
        self._step(self.alpha_optimizer, alpha_loss, _Params(self.log_alpha))
        self.last_actor_stats = {"actor_loss": float(pi_loss.detach()), "entropy": float(-logp.mean())}
        self._soft_update_critic()
        return {"critic_loss": float(q_loss.detach()), "alpha": float(alpha), "q_update_mean": float(q_mean),
                **self.last_actor_stats}, td_abs

    @property
    def actor_delay(self) -> int:
        """Critic updates per actor and temperature update (1: every update)."""
        return 1

    def entropy_alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def _target(self, rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, next_logp: torch.Tensor,
                alpha: torch.Tensor) -> torch.Tensor:
        return sac.soft_q_target(rewards, terminated, next_q, next_logp, alpha, self.cfg.gamma)

    def _next_q(self, next_obs: torch.Tensor, next_action: torch.Tensor) -> torch.Tensor:
        """The target critics' Q(s', a') rows the target takes its minimum over: both of SAC's."""
        return self.critic_target(next_obs, next_action)

    def _actor_loss(self, q_pi: torch.Tensor, logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return sac.actor_loss(q_pi, logp, alpha)

    def _update(self, b: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor | None]:
        if self.compiled:
            return self._compiled_update(b)
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_logp = self.actor.net(b["next_obs"])
            target = self._target(b["rewards"], b["terminated"], self._next_q(b["next_obs"], next_action),
                                  next_logp, alpha)
        q = self.critic(b["obs"], b["actions"])
        q_loss, td_abs = sac.critic_loss(q, target, b["weights"])
        self._step(self.critic_optimizer, q_loss, self.critic)
        self.critic_updates += 1

        if self.critic_updates % self.actor_delay == 0:
            action, logp = self.actor.net(b["obs"])
            pi_loss = self._actor_loss(self.critic(b["obs"], action), logp, alpha)
            self._step(self.actor_optimizer, pi_loss, self.actor)
            alpha_loss = sac.temperature_loss(self.log_alpha, logp, self.entropy_target)
            self._step(self.alpha_optimizer, alpha_loss, _Params(self.log_alpha))
            self.last_actor_stats = {"actor_loss": float(pi_loss.detach()), "entropy": float(-logp.detach().mean())}
        self._soft_update_critic()
        return {"critic_loss": float(q_loss.detach()), "alpha": float(alpha), "q_update_mean": float(q.detach().mean()),
                **self.last_actor_stats}, td_abs

    def state_dict(self) -> dict:
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "alpha_optimizer": self.alpha_optimizer.state_dict(), "critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.critic_updates = int(state.get("critic_updates", 0))


class _Params(torch.nn.Module):
    """A loose tensor as a module, for the shared optimizer-step helper."""

    def __init__(self, *tensors: torch.Tensor):
        super().__init__()
        self._tensors = tensors

    def parameters(self, recurse: bool = True):  # type: ignore[override]
        return iter(self._tensors)
