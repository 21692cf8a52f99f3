"""A trained policy as a torch module, loaded from a run directory.

`load_policy(RUN_DIR)` returns a `Policy`: raw env observations (numpy or tensor, one or a batch) -> actions,
greedy by default, sampled with `sample=True`. `PolicyHead` (raw observations -> the policy head's output,
with the observation normaliser and preprocessing inside) is also what `asyncrl-export` writes to a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import ActorCritic, MultiCategorical

OBS_CLIP = 5.0  # RunningMeanStd.normalize's default clip, what the trained model applies
NORM_EPS = 1e-8


class PolicyLoadError(ValueError):
    """A run whose policy cannot be loaded (no directory, no good checkpoint, a model that does not match)."""


class PolicyHead(nn.Module):
    """raw observations [N, *obs_shape] -> logits or action means [N, A] (float32).

    Everything the trained model does to an observation is inside: the running observation normaliser when
    the run used one (clipped to +-5), the CNN's `/ 255` scaling of uint8 frames. It computes in float32.
    """

    def __init__(self, model: ActorCritic):
        super().__init__()
        self.encoder = model.encoder
        self.policy_head = model.policy_head
        norm = model.obs_normalizer
        self.dict_obs = model.dict_obs
        if self.dict_obs:  # Dict observations: {key: [N, ...]}; per vector key, its normaliser's statistics
            self.normalize = False
            self.keys = list(model.encoder.encoders.keys())
            norms = dict(norm.items()) if norm is not None else {}
            self.normalized_keys = list(norms)
            for k, n in norms.items():
                self.register_buffer(f"obs_mean_{k}", n.mean.float().clone())
                self.register_buffer(f"obs_var_{k}", n.var.float().clone())
            self.register_buffer("obs_mean", torch.zeros(1))  # where the device is read from
            if not (model.discrete or model.nvec):
                self.register_buffer("log_std", model.log_std.detach().float().clone())
            return
        self.normalize = norm is not None
        shape = norm.shape if norm is not None else (1,)
        # float32 copies: the exported graph has no float64 ops (the trained model casts its stats the same way)
        self.register_buffer("obs_mean", (norm.mean if norm is not None else torch.zeros(shape)).float().clone())
        self.register_buffer("obs_var", (norm.var if norm is not None else torch.ones(shape)).float().clone())
        if not (model.discrete or model.nvec):
            self.register_buffer("log_std", model.log_std.detach().float().clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.dict_obs:
            return self.policy_head(self.encoder(self._normalized_dict(obs)))
        if self.normalize:
            x = obs.float()
            obs = torch.clamp((x - self.obs_mean) / torch.sqrt(self.obs_var + NORM_EPS), -OBS_CLIP, OBS_CLIP)
        return self.policy_head(self.encoder(obs))

    def _normalized_dict(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(obs)
        for k in self.normalized_keys:
            mean, var = getattr(self, f"obs_mean_{k}"), getattr(self, f"obs_var_{k}")
            out[k] = torch.clamp((obs[k].float() - mean) / torch.sqrt(var + NORM_EPS), -OBS_CLIP, OBS_CLIP)
        return out


@dataclass
class LoadedRun:
    model: ActorCritic
    spec: EnvSpec
    config: dict[str, Any]
    checkpoint: str
    version: Any


def load_run_policy(run_dir: str, device: str = "cpu") -> LoadedRun:
    """The run's model from its latest good checkpoint, in float32 and eval mode."""
    from asyncrl.config import Config
    from asyncrl.envs.base import EnvError
    from asyncrl.envs.registry import make_env_spec
    from asyncrl.models.actor_critic import build_model
    from asyncrl.runtime.checkpoint import CheckpointError, load_latest_checkpoint

    if not os.path.isdir(run_dir):
        raise PolicyLoadError(f"no run directory {run_dir}")
    try:
        path, state = load_latest_checkpoint(run_dir, map_location=device, warn=lambda msg: None)
    except CheckpointError as exc:
        raise PolicyLoadError(f"{exc}; train the run first (asyncrl-train)") from None
    try:
        config = json.loads(state["config"])
        cfg = Config.from_dict(config)
        spec = make_env_spec(state.get("env", cfg.env), cfg.env_kwargs_dict, doom_measurements=cfg.doom_measurements)
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise PolicyLoadError(f"{path} does not hold a run configuration ({exc})") from None
    except EnvError as exc:
        raise PolicyLoadError(f"cannot build the env {cfg.env!r} to size the model: {exc}") from None
    model = build_model(spec, cfg.hidden_size, cfg.normalize_obs).to(device)
    try:
        model.load_state_dict(state["learner"]["model"])
    except (RuntimeError, KeyError) as exc:
        raise PolicyLoadError(f"{path} does not match the model for {spec.name}: {str(exc).splitlines()[0]}"
                              ) from None
    return LoadedRun(model.eval(), spec, config, path, state["learner"].get("version"))


class Policy(nn.Module):
    """Raw observations -> actions, for a trained run (see `load_policy`).

    Takes one observation (the env's observation shape) or a batch of them (a leading batch dimension), as a
    numpy array or a tensor, and returns actions of the same kind: a numpy array (a numpy scalar for one
    discrete action) for numpy input, a tensor for tensor input. For a Dict observation space it takes a dict
    of such arrays (or tensors), one per key, as the env returns them (channels-last images included). Greedy
    actions are the most likely action (discrete) or the Gaussian mean clipped to the action bounds (continuous).
    """

    def __init__(self, run: LoadedRun, sample: bool = False):
        super().__init__()
        self.head = PolicyHead(run.model)
        self.spec = run.spec
        self.sample = sample
        self.checkpoint, self.version, self.config = run.checkpoint, run.version, run.config
        self.obs_shape = tuple(run.spec.obs_shape)
        if run.spec.channels_last:  # takes the env's (H, W, C) images, as gymnasium returns them
            self.obs_shape = (*self.obs_shape[1:], self.obs_shape[0])
        self.obs_dtype = np.dtype(run.spec.obs_dtype)
        # Dict observations: per key, the env's own shape (channels-last images as (H, W, C)) and dtype
        self.key_shapes = {k.key: (*k.shape[1:], k.shape[0]) if k.channels_last else k.shape
                           for k in run.spec.obs_keys}
        if not (run.spec.discrete or run.spec.multi_discrete):
            box = run.spec.action_space
            self.register_buffer("action_low", torch.as_tensor(np.asarray(box.low, np.float32)))
            self.register_buffer("action_high", torch.as_tensor(np.asarray(box.high, np.float32)))

    @property
    def discrete(self) -> bool:
        return self.spec.discrete

    @property
    def device(self) -> torch.device:
        return self.head.obs_mean.device

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy head's output for a batch of raw observations: logits, or Gaussian means."""
        return self.head(obs)

    @torch.no_grad()
    def forward(self, obs: np.ndarray | torch.Tensor | dict, sample: bool | None = None) -> np.ndarray | torch.Tensor:
        if self.spec.is_dict:
            as_numpy, single, out = self._dict_head(obs)
        else:
            as_numpy = not isinstance(obs, torch.Tensor)
            x = torch.as_tensor(np.asarray(obs, dtype=self.obs_dtype) if as_numpy else obs, device=self.device)
            single = tuple(x.shape) == self.obs_shape
            if not single and tuple(x.shape[1:]) != self.obs_shape:
                raise ValueError(f"observations of shape {tuple(x.shape)} do not fit this policy: it takes "
                                 f"{self.obs_shape} or a batch [N, {', '.join(map(str, self.obs_shape))}]")
            x = x.unsqueeze(0) if single else x
            out = self.head(x.permute(0, 3, 1, 2) if self.spec.channels_last else x)
        actions = self._sample(out) if (self.sample if sample is None else sample) else self._greedy(out)
        if single:
            actions = actions[0]
        if not as_numpy:
            return actions
        actions = actions.cpu().numpy()
        return actions[()] if actions.ndim == 0 else actions  # one discrete action: a numpy scalar

    def _dict_head(self, obs: dict) -> tuple[bool, bool, torch.Tensor]:
        """(numpy input, one observation, head output) for a dict of raw per-key observations."""
        if not isinstance(obs, dict) or set(obs) != set(self.key_shapes):
            got = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(f"this policy takes a dict with keys {sorted(self.key_shapes)}, got {got}")
        as_numpy = not any(isinstance(v, torch.Tensor) for v in obs.values())
        x, single = {}, None
        for k in self.spec.obs_keys:
            v = obs[k.key]
            t = torch.as_tensor(np.asarray(v, dtype=k.dtype) if not isinstance(v, torch.Tensor) else v,
                                device=self.device)
            shape = self.key_shapes[k.key]
            one = tuple(t.shape) == shape
            if (not one and tuple(t.shape[1:]) != shape) or (single is not None and one != single):
                raise ValueError(f"observation {k.key!r} of shape {tuple(t.shape)} does not fit this policy: it "
                                 f"takes {shape} or a batch [N, {', '.join(map(str, shape))}] (the same for every key)")
            single = one
            t = t.unsqueeze(0) if one else t
            x[k.key] = t.permute(0, 3, 1, 2) if k.channels_last else t
        return as_numpy, bool(single), self.head(x)

    def _greedy(self, out: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return out.argmax(-1)
        if self.spec.multi_discrete:  # the most likely choice of each component
            return MultiCategorical(out, self.spec.nvec).mode
        return torch.clamp(out, self.action_low, self.action_high)

    def _sample(self, out: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return torch.distributions.Categorical(logits=out).sample()
        if self.spec.multi_discrete:
            return MultiCategorical(out, self.spec.nvec).sample()
        noisy = out + self.head.log_std.exp() * torch.randn_like(out)
        return torch.clamp(noisy, self.action_low, self.action_high)


def load_policy(run_dir: str, sample: bool = False, device: str = "cpu") -> Policy:
    """The policy of the run's newest good checkpoint, in eval mode: `policy(obs) -> action`.

    `obs` are raw observations as asyncrl's env for the run returns them (for gymnasium ids, what
    `gymnasium.make(id)` returns; for `atari_<game>`, stacked 84x84 grayscale frames, channels first).
    `sample=True` samples actions from the policy's distribution instead of taking the most likely one;
    `policy(obs, sample=...)` overrides it per call. Raises PolicyLoadError if the run has no usable policy.
    """
    return Policy(load_run_policy(run_dir, device), sample).eval()
