"""TD3 learner: a deterministic actor, clipped double Q with target policy smoothing, and the actor and target
networks updated every second critic update (Fujimoto et al. 2018; `asyncrl.agents.off_policy.td3_loss`).

The policy workers add Gaussian exploration noise of `--exploration-noise` half action ranges to the actor's
action (`OffPolicyActor.act` with `deterministic`). The actor is the same tanh-squashed network SAC uses, acting
with its mean (its log-std head is unused and gets no gradient).
"""

from __future__ import annotations

import copy

import torch

from asyncrl.agents.off_policy import sac_loss as sac
from asyncrl.agents.off_policy import td3_loss as td3
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.critics import polyak_update

POLICY_NOISE, NOISE_CLIP, POLICY_DELAY = 0.2, 0.5, 2  # the paper's, in half action ranges


class TD3Learner(OffPolicyLearner):
    deterministic_actor = True

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        super().__init__(cfg, spec, device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_updates = 0
        self.last_actor_loss = 0.0

    def _update(self, b: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor | None]:
        half = self.actor.net.half_range
        with torch.no_grad():
            mu, _ = self.actor_target.policy(b["next_obs"])
            noise = (torch.randn_like(mu) * POLICY_NOISE).clamp(-NOISE_CLIP, NOISE_CLIP) * half
            next_action = td3.smoothed_target_action(mu, self.actor.low, self.actor.high, noise=noise,
                                                     noise_clip=float("inf"))
            target = td3.clipped_double_q_target(b["rewards"], b["terminated"],
                                                 self.critic_target(b["next_obs"], next_action), self.cfg.gamma)
        q = self.critic(b["obs"], b["actions"])
        q_loss, td_abs = sac.critic_loss(q, target, b["weights"])
        self._step(self.critic_optimizer, q_loss, self.critic)
        self.critic_updates += 1
        if td3.actor_update_due(self.critic_updates, POLICY_DELAY):
            action, _ = self.actor.policy(b["obs"])
            pi_loss = td3.actor_loss(self.critic(b["obs"], action)[0])
            self._step(self.actor_optimizer, pi_loss, self.actor)
            self.last_actor_loss = float(pi_loss.detach())
            self._soft_update_critic()
            polyak_update(self.actor_target, self.actor, self.cfg.tau)
        return {"critic_loss": float(q_loss.detach()), "actor_loss": self.last_actor_loss, "alpha": 0.0,
                "q_update_mean": float(q.detach().mean())}, td_abs

    def state_dict(self) -> dict:
        return {**super().state_dict(), "actor_target": self.actor_target.state_dict(),
                "critic_updates": self.critic_updates}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.actor_target.load_state_dict(state["actor_target"])
        self.critic_updates = int(state["critic_updates"])
