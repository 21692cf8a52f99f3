"""A trained policy as a torch module, loaded from a run directory.

`load_policy(RUN_DIR)` returns a `Policy`: raw env observations (numpy or tensor, one or a batch) -> actions,
greedy by default, sampled with `sample=True`. The run's `algo` says which module its checkpoint holds and under
which key (`asyncrl.agents.registry.published_policy`), and how to act with it (its `ActingHead`, which is also
what `asyncrl-export` writes to a file). `PolicyHead` is APPO's (`asyncrl.agents.appo.head`): raw
observations -> the policy head's output, with the observation normaliser and preprocessing inside. Actions come
from the head's `act` (the acting contract, `asyncrl.agents.acting`).
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from asyncrl.agents.acting import module_device
from asyncrl.agents.appo.head import NORM_EPS, OBS_CLIP, PolicyHead
from asyncrl.envs.base import EnvSpec

if TYPE_CHECKING:
    from asyncrl.agents.base import ActingHead

__all__ = ["NORM_EPS", "OBS_CLIP", "LoadedRun", "Policy", "PolicyHead", "PolicyLoadError", "RecurrentPolicy",
           "load_policy", "load_run_policy", "module_device", "read_checkpoint", "restore_policy"]


class PolicyLoadError(ValueError):
    """A run whose policy cannot be loaded (no directory, no good checkpoint, a model that does not match)."""


@dataclass
class LoadedRun:
    model: nn.Module  # the published policy module (`build_policy` of the run's algo) with the checkpoint's weights
    head: ActingHead
    spec: EnvSpec
    config: dict[str, Any]
    checkpoint: str
    version: Any


def load_run_policy(run_dir: str, device: str = "cpu", best: bool = False, policy: int = 0) -> LoadedRun:
    """The run's policy from its latest good checkpoint (`best`: from checkpoints/best.pt), float32, eval mode;
    `policy` picks one of a --num-policies run's."""
    from asyncrl.config import Config
    from asyncrl.envs.base import EnvError
    from asyncrl.envs.registry import make_env_spec
    from asyncrl.runtime.store.checkpoint import CheckpointError

    if not os.path.isdir(run_dir):
        raise PolicyLoadError(f"no run directory {run_dir}")
    try:
        path, state = read_checkpoint(run_dir, best, warn=lambda msg: None)
    except CheckpointError as exc:
        raise PolicyLoadError(str(exc) if best else f"{exc}; train the run first (asyncrl-train)") from None
    try:
        config = json.loads(state["config"])
        cfg = Config.from_dict(config)
        spec = make_env_spec(cfg, env=state.get("env", cfg.env))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise PolicyLoadError(f"{path} does not hold a run configuration ({exc})") from None
    except EnvError as exc:
        raise PolicyLoadError(f"cannot build the env {cfg.env!r} to size the model: {exc}") from None
    return restore_policy(state, path, spec, device, policy)


def policy_learner_state(state: dict[str, Any], path: str, policy: int = 0) -> dict[str, Any]:
    """The learner state of policy `policy` of a checkpoint (0: `learner`; a --num-policies run keeps the others
    in `policies`); PolicyLoadError (one line) when the run has no such policy."""
    count = 1 + len(state.get("policies", []))
    if not 0 <= policy < count:
        raise PolicyLoadError(f"{path} holds {count} {'policy' if count == 1 else 'policies'} (0..{count - 1}); "
                              f"there is no policy {policy}")
    return state["learner"] if policy == 0 else state["policies"][policy - 1]


def read_checkpoint(run_dir: str, best: bool, warn) -> tuple[str, dict[str, Any]]:
    """(path, state) of the run's newest good checkpoint, or of checkpoints/best.pt with `best`; CheckpointError
    (one line, what to do) when there is none. Read on the CPU, whatever device the run trained on:
    `restore_policy` places the weights on its `device`."""
    from asyncrl.runtime.store.best_checkpoint import best_path, load_best
    from asyncrl.runtime.store.checkpoint import CheckpointError, load_latest_checkpoint

    if not best:
        return load_latest_checkpoint(run_dir, map_location="cpu", warn=warn)
    path = best_path(run_dir)
    if not os.path.exists(path):
        raise CheckpointError(f"no {path}: it is written by a run trained with --eval-every")
    try:
        return path, load_best(run_dir, map_location="cpu")
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot read {path} ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None


def restore_policy(state: dict[str, Any], path: str, spec: EnvSpec, device: str = "cpu",
                   policy_index: int = 0) -> LoadedRun:
    """The policy a checkpoint's `learner` state holds (of policy `policy_index` in a --num-policies run), as the
    run's algo publishes it (`asyncrl.agents`)."""
    from asyncrl.agents.registry import published_policy
    from asyncrl.config import Config, ConfigError

    try:
        config = json.loads(state["config"])
        cfg = Config.from_dict(config)
        published = published_policy(cfg.algo)
    except (KeyError, TypeError, json.JSONDecodeError, ConfigError) as exc:
        raise PolicyLoadError(f"{path} does not hold a run configuration ({exc})") from None
    learner = policy_learner_state(state, path, policy_index)
    policy = published.build_policy(spec, cfg, torch.device(device))
    try:
        policy.load_state_dict(learner[published.policy_state_key])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise PolicyLoadError(f"{path} does not match the model for {spec.name}: {str(exc).splitlines()[0]}"
                              ) from None
    policy.eval()
    head = published.policy_head(policy, spec).to(device)  # the head's own buffers go where the policy is
    return LoadedRun(policy, head.eval(), spec, config, path, learner.get("version"))


class Policy(nn.Module):
    """Raw observations -> actions, for a trained run (see `load_policy`).

    Takes one observation (the env's observation shape) or a batch of them (a leading batch dimension), as a
    numpy array or a tensor, and returns actions of the same kind: a numpy array (a numpy scalar for one
    discrete action) for numpy input, a tensor for tensor input. Greedy and sampled actions are the run's
    algo's (the head's `act`, `asyncrl.agents.acting`): for APPO the most likely action (discrete) or the
    Gaussian mean clipped to the action bounds (continuous); for SAC and REDQ `center + half_range tanh(mean)`,
    for TD3 the deterministic actor's action.
    For a Dict observation space it takes a dict of such arrays (or tensors), one per key, as the env returns
    them (channels-last images included).
    """

    def __init__(self, run: LoadedRun, sample: bool = False):
        super().__init__()
        self.head = run.head
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

    @property
    def discrete(self) -> bool:
        return self.spec.discrete

    @property
    def device(self) -> torch.device:
        return module_device(self.head)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy head's output for a batch of raw observations (what `asyncrl-export` writes): logits or
        Gaussian means (APPO), the greedy action (SAC, TD3, REDQ)."""
        return self.head(obs)

    recurrent = False  # a feed-forward policy: `policy(obs)`; see `RecurrentPolicy` for a run trained with --rnn

    @torch.no_grad()
    def forward(self, obs: np.ndarray | torch.Tensor | dict, sample: bool | None = None) -> np.ndarray | torch.Tensor:
        as_numpy, single, x = self._batch(obs)
        n = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
        first = torch.ones(n, dtype=torch.bool, device=self.device)  # each call: observations of fresh episodes
        sample = self.sample if sample is None else sample
        actions, _, _ = self.head.act(x, self.head.initial_state(n), first, greedy=not sample)
        return self._actions_out(actions, as_numpy, single)

    def _batch(self, obs: np.ndarray | torch.Tensor | dict) -> tuple[bool, bool, torch.Tensor | dict]:
        """(numpy input, one observation, the batch as the head takes it)."""
        if self.spec.is_dict:
            return self._dict_obs(obs)
        as_numpy = not isinstance(obs, torch.Tensor)
        x = torch.as_tensor(np.asarray(obs, dtype=self.obs_dtype) if as_numpy else obs, device=self.device)
        single = tuple(x.shape) == self.obs_shape
        if not single and tuple(x.shape[1:]) != self.obs_shape:
            raise ValueError(f"observations of shape {tuple(x.shape)} do not fit this policy: it takes "
                             f"{self.obs_shape} or a batch [N, {', '.join(map(str, self.obs_shape))}]")
        x = x.unsqueeze(0) if single else x
        return as_numpy, single, x.permute(0, 3, 1, 2) if self.spec.channels_last else x

    @staticmethod
    def _actions_out(actions: torch.Tensor, as_numpy: bool, single: bool) -> np.ndarray | torch.Tensor:
        if single:
            actions = actions[0]
        if not as_numpy:
            return actions
        actions = actions.cpu().numpy()
        return actions[()] if actions.ndim == 0 else actions  # one discrete action: a numpy scalar

    def _dict_obs(self, obs: dict) -> tuple[bool, bool, dict[str, torch.Tensor]]:
        """(numpy input, one observation, batched per-key tensors) for a dict of raw per-key observations."""
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
        return as_numpy, bool(single), x


class RecurrentPolicy(Policy):
    """A run trained with --rnn: the policy carries a state from step to step.

        state = policy.initial_state(n)            # n envs at the start of their episodes (zeros)
        action, state = policy(obs, state)         # obs: one observation (n = 1) or a batch of n

    The state is a dict of tensors (the core's "h", and "c" for an LSTM; [n, rnn_layers, rnn_size] each) to hand
    back unchanged at the next step. When an env's episode ends, start its next one from zeros: a fresh
    `initial_state`, or for a batch `{k: v * (1 - done[:, None, None]) ...}` with `done` that env's flag.
    """

    recurrent = True

    def initial_state(self, n: int = 1) -> dict[str, torch.Tensor]:
        return self.head.initial_state(n)

    @torch.no_grad()
    def forward(self, obs: np.ndarray | torch.Tensor | dict, state: dict[str, torch.Tensor] | None = None,
                sample: bool | None = None) -> tuple[np.ndarray | torch.Tensor, dict[str, torch.Tensor]]:
        as_numpy, single, x = self._batch(obs)
        if state is None:
            raise ValueError("this policy is recurrent: call it as policy(obs, state), starting from "
                             "state = policy.initial_state(n)")
        sample = self.sample if sample is None else sample
        actions, _, after = self.head.act(x, {k: v.to(self.device) for k, v in state.items()}, None,
                                          greedy=not sample)
        return self._actions_out(actions, as_numpy, single), after


def load_policy(run_dir: str, sample: bool = False, device: str = "cpu", best: bool = False,
                policy: int = 0) -> Policy:
    """The policy of the run's newest good checkpoint (`best`: of checkpoints/best.pt, the best evaluation of a
    run trained with --eval-every), in eval mode: `policy(obs) -> action`. Any `--algo`.

    `obs` are raw observations as asyncrl's env for the run returns them (for gymnasium ids, what
    `gymnasium.make(id)` returns; for `atari_<game>`, stacked 84x84 grayscale frames, channels first).
    `sample=True` samples actions from the policy's distribution instead of taking the most likely one;
    `policy(obs, sample=...)` overrides it per call. Raises PolicyLoadError if the run has no usable policy.
    A run trained with --rnn gives a `RecurrentPolicy`: `state = policy.initial_state(n)`, then
    `action, state = policy(obs, state)` at each step (`policy.recurrent` tells the two apart). A run trained
    with --num-policies N holds N policies: `policy=k` picks one (0 by default).
    """
    run = load_run_policy(run_dir, device, best, policy)
    return (RecurrentPolicy if run.head.state_layout() else Policy)(run, sample).eval()
