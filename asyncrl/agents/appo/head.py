"""APPO's acting head: raw observations -> the actor-critic's policy output, and actions through the acting
contract (`asyncrl.agents.acting`). What `asyncrl.load_policy`, `asyncrl-enjoy` and `asyncrl-export` run for
an APPO run (`APPOLearner.policy_head`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from asyncrl.agents.acting import FeedForward, State, module_device
from asyncrl.algo.normalizers import NORM_EPS, OBS_CLIP
from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import (
    ActorCritic,
    RecurrentActorCritic,
    action_distribution,
    apply_action_mask,
    greedy_actions,
    sample_actions,
)
from asyncrl.models.cores import reset_rows
from asyncrl.models.obs import Obs
from asyncrl.models.tuple_actions import clip_boxes


class PolicyHead(nn.Module, FeedForward):
    """raw observations [N, *obs_shape] -> logits or action means [N, A] (float32): APPO's `ActingHead`, and an
    `asyncrl.agents.acting.Actor` without state.

    Everything the trained model does to an observation is inside: the running observation normaliser when
    the run used one (clipped to +-5), the CNN's `/ 255` scaling of uint8 frames. It computes in float32.
    Greedy actions are the most likely action (discrete) or the Gaussian mean clipped to the action bounds.
    """

    def __init__(self, model: ActorCritic, spec: EnvSpec):
        super().__init__()
        self.encoder = model.encoder
        self.policy_head = model.policy_head
        self.spec = spec
        self.output_name = ("logits" if spec.discrete or spec.multi_discrete else
                            "logits_and_means" if spec.is_tuple else "action_mean")
        norm = model.obs_normalizer
        device = module_device(model)  # every buffer beside the model's own weights: inputs are moved there
        self.dict_obs = model.dict_obs
        if self.dict_obs:  # Dict observations: {key: [N, ...]}; per vector key, its normaliser's statistics
            self.normalize = False
            self.keys = [k.key for k in spec.feature_keys]
            norms = dict(norm.items()) if norm is not None else {}
            self.normalized_keys = list(norms)
            for k, n in norms.items():
                self.register_buffer(f"obs_mean_{k}", n.mean.float().clone().to(device))
                self.register_buffer(f"obs_var_{k}", n.var.float().clone().to(device))
            self.register_buffer("obs_mean", torch.zeros(1, device=device))  # the key every export format has
        else:
            self.normalize = norm is not None
            shape = norm.shape if norm is not None else (1,)
            # float32 copies: the exported graph has no float64 ops (the trained model casts its stats the same way)
            self.register_buffer("obs_mean", (norm.mean if norm is not None else torch.zeros(shape)).float().clone()
                                 .to(device))
            self.register_buffer("obs_var", (norm.var if norm is not None else torch.ones(shape)).float().clone()
                                 .to(device))
        if model.parts:  # a Tuple action: its Box parts' log_std; each part's bounds come with the spec
            if spec.gaussian_dims:
                self.register_buffer("log_std", model.log_std.detach().float().clone())
        elif not (model.discrete or model.nvec):
            self.register_buffer("log_std", model.log_std.detach().float().clone())
            box = spec.action_space  # not saved with the weights: the exported files describe the bounds
            self.register_buffer("action_low", torch.as_tensor(np.asarray(box.low, np.float32), device=device),
                                 persistent=False)
            self.register_buffer("action_high", torch.as_tensor(np.asarray(box.high, np.float32), device=device),
                                 persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self._logits(self._features(obs), obs)

    def _features(self, obs: Obs) -> torch.Tensor:
        """Raw observations -> the encoder's features (the normaliser applied first)."""
        if self.dict_obs:
            return self.encoder(self._normalized_dict(obs))
        if self.normalize:
            x = obs.float()
            obs = torch.clamp((x - self.obs_mean) / torch.sqrt(self.obs_var + NORM_EPS), -OBS_CLIP, OBS_CLIP)
        return self.encoder(obs)

    def _logits(self, features: torch.Tensor, obs: Obs) -> torch.Tensor:
        logits = self.policy_head(features)
        return apply_action_mask(logits, obs) if self.dict_obs and self.spec.masked else logits

    def actions(self, obs: Obs, sample: bool) -> torch.Tensor:
        n = next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]
        return self.act(obs, self.initial_state(n), None, greedy=not sample)[0]

    @torch.no_grad()
    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """The acting contract: greedy or sampled actions (as the policy workers draw them), clipped to the action
        bounds, and the log-probs of the actions drawn (before the clipping)."""
        actions, logp = self._draw(self(obs), greedy)
        return actions, logp, state

    def _draw(self, out: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        spec, log_std = self.spec, getattr(self, "log_std", None)
        if greedy:
            actions = greedy_actions(out, spec)
            logp = action_distribution(out, spec.discrete, spec.nvec, spec.parts, log_std).log_prob(actions)
        else:
            actions, logp = sample_actions(out, spec.discrete, spec.nvec, spec.parts, log_std)
            if spec.is_tuple:
                actions = clip_boxes(actions, spec.parts)
        if not (spec.discrete or spec.multi_discrete or spec.is_tuple):  # a Tuple's Box parts are clipped above
            actions = torch.clamp(actions, self.action_low, self.action_high)
        return actions, logp

    def describe(self) -> dict[str, Any]:
        spec = self.spec
        pre: list[dict[str, Any]] = []
        if self.dict_obs and self.normalized_keys:
            pre.append({"op": "normalize", "keys": list(self.normalized_keys),
                        "formula": "clip((obs[key] - mean) / sqrt(var + eps), -clip, clip)", "eps": NORM_EPS,
                        "clip": OBS_CLIP, "mean_key": "obs_mean_<key>", "var_key": "obs_var_<key>",
                        "applied_inside_model": True})
        elif self.normalize:
            pre.append({"op": "normalize", "formula": "clip((obs - mean) / sqrt(var + eps), -clip, clip)",
                        "eps": NORM_EPS, "clip": OBS_CLIP, "mean_key": "obs_mean", "var_key": "obs_var",
                        "applied_inside_model": True})
        scale = {"op": "scale", "formula": "obs / 255", "applied_inside_model": True}  # frames not normalised
        if self.dict_obs:
            scaled = [k.key for k in spec.obs_keys if k.image and k.key not in self.normalized_keys]
            if scaled:
                pre.append({**scale, "keys": scaled})
        elif spec.has_image and not self.normalize:
            pre.append(scale)
        if spec.is_tuple:
            output = {"name": "logits_and_means", "shape": ["N", spec.num_actions],
                      "meaning": "each Tuple part's logits (Discrete, MultiDiscrete component after component) or "
                                 "Gaussian means (Box) one after another, as action.parts' out_offset/out_width "
                                 "give; the greedy action is each part's argmax (plus start) or its mean clipped to "
                                 "the bounds",
                      **({"log_std": self.log_std.tolist()} if spec.gaussian_dims else {})}
        elif spec.multi_discrete:
            output = {"name": "logits", "shape": ["N", spec.num_actions],
                      "meaning": "the components' logits one after another (nvec[0] of them, then nvec[1], ...); "
                                 "the greedy action is the argmax within each component, plus start"}
        elif spec.discrete:
            output = {"name": "logits", "shape": ["N", spec.num_actions],
                      "meaning": "unnormalised log-probabilities of each action; argmax is the greedy action, "
                                 "softmax the policy's probabilities"}
        else:
            output = {"name": "action_mean", "shape": ["N", spec.num_actions],
                      "meaning": "means of the diagonal Gaussian policy (the greedy action, before clipping to the "
                                 "action bounds); std = exp(log_std) from the weights file",
                      "log_std": self.log_std.tolist()}
        return {"preprocessing": pre, "output": output}

    def _normalized_dict(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(obs)
        for k in self.normalized_keys:
            mean, var = getattr(self, f"obs_mean_{k}"), getattr(self, f"obs_var_{k}")
            out[k] = torch.clamp((obs[k].float() - mean) / torch.sqrt(var + NORM_EPS), -OBS_CLIP, OBS_CLIP)
        return out


class RecurrentPolicyHead(PolicyHead):
    """APPO's acting head for a model with a recurrent core (`--rnn`): raw observations and the state before the
    step -> the policy output and the state after it, an `asyncrl.agents.acting.Actor` with state.

    `forward(obs, *state) -> (policy output, *next state)`, the state entries in the core's order (`state_keys`:
    "h" for a GRU; "h", "c" for an LSTM), each [N, rnn_layers, rnn_size]: what `asyncrl-export` writes, so an
    exported graph takes the state as inputs and returns it as outputs. An episode starts from zeros
    (`initial_state`); `act` resets the rows where `first` is set itself.
    """

    def __init__(self, model: RecurrentActorCritic, spec: EnvSpec):
        super().__init__(model, spec)
        self.core = model.core
        self.state_keys = tuple(model.core.state_keys)

    def state_layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return self.core.state_layout()

    def initial_state(self, n: int) -> State:
        return self.core.initial_state(n, device=module_device(self))

    def forward(self, obs: Obs, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """No state given: the first step of fresh episodes (zeros)."""
        features = self._features(obs)
        before = dict(zip(self.state_keys, state, strict=True)) if state else self.initial_state(features.shape[0])
        out, after = self.core.cell_step(features, before)  # plain tensor ops: what the exported graphs hold
        return (self._logits(out, obs), *(after[k] for k in self.state_keys))

    @torch.no_grad()
    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        if first is not None:
            state = reset_rows(state, first)
        out, *after = self(obs, *(state[k] for k in self.state_keys))
        actions, logp = self._draw(out, greedy)
        return actions, logp, dict(zip(self.state_keys, after))

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        layout = self.state_layout()
        described["state"] = [{"name": k, "shape": ["N", *layout[k][0]], "dtype": "float32",
                               "meaning": f"the recurrent core's {'cell' if k == 'c' else 'hidden'} state before the "
                                          f"step (zeros at an episode's start); the step returns the next one"}
                              for k in self.state_keys]
        return described
