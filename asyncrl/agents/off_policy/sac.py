"""SAC learner: twin critics, a tanh-Gaussian actor and automatic temperature (Haarnoja et al. 2018).

Per update: critic step on the soft Bellman target (min of the two target critics), actor step, temperature
step towards the entropy target -|A|, Polyak update of the target critics. Replay, UTD and the published actor
are `asyncrl.agents.off_policy.learner`'s; the maths is `asyncrl.agents.off_policy.sac_loss`.
"""

from __future__ import annotations

import torch

from asyncrl.agents.eager import Adam
from asyncrl.agents.off_policy import sac_loss as sac
from asyncrl.agents.off_policy.learner import OffPolicyLearner
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
