"""The actor-critic: an encoder, a policy head (categorical, product of categoricals, or diagonal Gaussian) and a
value head."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from asyncrl.algo.normalizers import RunningMeanStd
from asyncrl.envs.base import MASK_KEY, EnvSpec
from asyncrl.models.categorical import PAD_LOGIT, MultiCategorical, gumbel_argmax
from asyncrl.models.encoders import MLP, DictEncoder, NatureCNN
from asyncrl.models.obs import Obs
from asyncrl.models.tuple_actions import TupleDistribution, clip_boxes


def apply_action_mask(logits: torch.Tensor, obs: Obs) -> torch.Tensor:
    """Logits with every action the observation's `action_mask` forbids (0) set to a probability of 0."""
    return logits.masked_fill(obs[MASK_KEY] < 0.5, PAD_LOGIT)


def greedy_actions(policy_out: torch.Tensor, spec: EnvSpec) -> torch.Tensor:
    """The most likely action from a published policy's output: the argmax of discrete logits, the argmax within
    each MultiDiscrete component, and for continuous actions the output itself (a Gaussian mean, or an
    off-policy actor's greedy action)."""
    return greedy_from(policy_out, spec.discrete, spec.nvec, spec.parts)


def greedy_from(out: torch.Tensor, discrete: bool, nvec: tuple[int, ...], parts: tuple) -> torch.Tensor:
    """`greedy_actions` from the action space's description (as the ActorCritic keeps it)."""
    if discrete:
        return out.argmax(-1)
    if nvec:
        return MultiCategorical(out, nvec).mode
    if parts:
        return clip_boxes(TupleDistribution(out, parts, None).mode, parts)
    return out


def action_distribution(out: torch.Tensor, discrete: bool, nvec: tuple[int, ...], parts: tuple,
                        log_std: torch.Tensor | None) -> Distribution:
    """The policy's distribution over actions from a policy head's output `out` [N, A]."""
    if discrete:
        return Categorical(logits=out)
    if nvec:
        return MultiCategorical(out, nvec)
    if parts:
        return TupleDistribution(out, parts, log_std)
    return Independent(Normal(out, log_std.exp().expand_as(out)), 1)


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Frames share one Nature CNN between policy and value; vectors get separate policy and value MLPs
    (as in most PPO baselines), so large unnormalised returns cannot swamp the policy's features. A Dict
    observation gets a `DictEncoder` (a CNN per image key shared by policy and value, a policy and a value MLP
    per vector key, concatenated); its observation normaliser (`normalize_obs`) is one running mean/std per
    vector key."""

    def __init__(self, spec: EnvSpec, hidden_size: int = 64, normalize_obs: bool = False):
        super().__init__()
        self.discrete = spec.discrete
        self.nvec = spec.nvec  # MultiDiscrete component sizes, () otherwise
        self.parts = spec.parts  # a Tuple action's parts, () otherwise
        image = len(spec.obs_shape) == 3
        self.dict_obs = spec.is_dict
        self.masked = spec.masked  # an `action_mask` key: masks the logits, never reaches the encoder
        if spec.is_dict:
            self.encoder = DictEncoder(spec.feature_keys, hidden_size)
            self.value_encoder = None
        elif image:
            self.encoder: nn.Module = NatureCNN(*spec.obs_shape)
            self.value_encoder: nn.Module | None = None
        else:
            self.encoder = MLP(int(np.prod(spec.obs_shape)), hidden_size)
            self.value_encoder = MLP(int(np.prod(spec.obs_shape)), hidden_size)
        width = self.encoder.out_features
        self.policy_head = _init_linear(nn.Linear(width, spec.num_actions), 0.01)
        self.value_head = _init_linear(nn.Linear(width, 1), 1.0)
        if spec.gaussian_dims:  # a Box action, or a Tuple's Box parts
            self.log_std = nn.Parameter(torch.zeros(spec.gaussian_dims))
        self.obs_normalizer: nn.Module | None = RunningMeanStd(spec.obs_shape) if normalize_obs and not image else None
        if spec.is_dict:  # vector keys only
            vectors = {k.key: RunningMeanStd(k.shape) for k in spec.feature_keys if not k.image}
            self.obs_normalizer = nn.ModuleDict(vectors) if normalize_obs and vectors else None
        self.compute_dtype: torch.dtype | None = None  # encoder autocast dtype (bf16), None for float32
        for encoder in (self.encoder, self.value_encoder):  # a DictEncoder's value MLPs are in self.encoder
            for module in encoder.modules() if encoder is not None else ():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(module.weight, math.sqrt(2))
                    nn.init.zeros_(module.bias)

    def forward(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [N, ...] -> (policy head output [N, A]: logits or Gaussian means, value [N])."""
        obs = self._normalized(obs)
        if self.dict_obs:
            features, value_features = self.encoder.both(obs, self.compute_dtype)
            logits = self.policy_head(features)
            if self.masked:
                logits = apply_action_mask(logits, obs)
            return logits, self.value_head(value_features).squeeze(-1)
        features = self._encode(self.encoder, obs)
        value_features = features if self.value_encoder is None else self._encode(self.value_encoder, obs)
        return self.policy_head(features), self.value_head(value_features).squeeze(-1)

    def _encode(self, encoder: nn.Module, obs: Obs) -> torch.Tensor:
        """The encoder under autocast when a compute dtype is set; the heads always see float32 features."""
        if self.dict_obs:
            return encoder(obs, self.compute_dtype)
        if self.compute_dtype is None:
            return encoder(obs)
        with torch.autocast(obs.device.type, dtype=self.compute_dtype):
            return encoder(obs).float()

    def _normalized(self, obs: Obs) -> Obs:
        if self.obs_normalizer is None:
            return obs
        if isinstance(obs, dict):
            norms = self.obs_normalizer
            return {k: norms[k].normalize(v.float()).float() if k in norms else v for k, v in obs.items()}
        return self.obs_normalizer.normalize(obs.float()).float()

    def update_obs_normalizer(self, obs: Obs, mask: torch.Tensor) -> None:
        """Fold the observations where `mask` (their leading dimensions) is True into the normaliser."""
        if self.obs_normalizer is None:
            return
        if isinstance(obs, dict):
            for k, norm in self.obs_normalizer.items():
                norm.update(obs[k][mask])
        else:
            self.obs_normalizer.update(obs[mask])

    def distribution(self, policy_out: torch.Tensor) -> Distribution:
        return action_distribution(policy_out, self.discrete, self.nvec, self.parts, getattr(self, "log_std", None))

    def policy_out(self, obs: Obs) -> torch.Tensor:
        """obs [N, ...] -> the policy head's output [N, A] (masked logits or Gaussian means); no value head."""
        out = self.policy_head(self._encode(self.encoder, self._normalized(obs)))
        return apply_action_mask(out, obs) if self.masked else out

    @torch.inference_mode()
    def act(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions for inference: (actions, log-probs); see `sample_actions`."""
        return sample_actions(self.policy_out(obs), self.discrete, self.nvec, self.parts,
                              getattr(self, "log_std", None))

    @torch.inference_mode()
    def greedy(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely actions and their log-probs: the argmax (within each component), the Gaussian mean
        (not clipped; a Tuple's Box parts clipped to their bounds)."""
        out = self.policy_out(obs)
        actions = greedy_from(out, self.discrete, self.nvec, self.parts)
        return actions, self.distribution(out).log_prob(actions)


def sample_actions(out: torch.Tensor, discrete: bool, nvec: tuple[int, ...], parts: tuple,
                   log_std: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(actions, log-probs) drawn from a policy head's output `out` [N, A].

    The hot path of every policy worker, so it avoids building distribution objects where it can: Gumbel-max
    sampling for categorical heads (all MultiDiscrete components at once), reparameterised noise for Gaussian
    ones (not clipped to the action bounds: the log-prob is the drawn action's).
    """
    if discrete:
        logp_all = torch.log_softmax(out, dim=-1)
        actions = gumbel_argmax(logp_all)
        return actions, logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    if nvec:
        dist = MultiCategorical(out, nvec)
        actions = dist.sample()
        return actions, dist.log_prob(actions)
    if parts:
        dist = TupleDistribution(out, parts, log_std)
        actions = dist.sample()
        return actions, dist.log_prob(actions)
    eps = torch.randn_like(out)
    actions = out + log_std.exp() * eps
    logp = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    return actions, logp


def build_model(spec: EnvSpec, hidden_size: int = 64, normalize_obs: bool = False) -> ActorCritic:
    return ActorCritic(spec, hidden_size, normalize_obs)


def flat_state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers in a fixed order: what the learner publishes to the policy workers."""
    return [t for t in model.state_dict(keep_vars=True).values() if t.dtype.is_floating_point]


def flat_numel(model: nn.Module) -> int:
    return sum(t.numel() for t in flat_state(model))
