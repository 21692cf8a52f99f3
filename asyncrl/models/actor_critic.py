"""The actor-critic: an encoder, a policy head (categorical, product of categoricals, or diagonal Gaussian) and a
value head."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from asyncrl.algo.normalizers import RunningMeanStd, fold_frames, frame_normalizer, standardize_frames
from asyncrl.envs.base import MASK_KEY, EnvSpec
from asyncrl.models.categorical import PAD_LOGIT, MultiCategorical, gumbel_argmax
from asyncrl.models.cores import RecurrentCore, State, build_core, reset_rows
from asyncrl.models.encoders import (
    MLP,
    DictEncoder,
    EncoderError,
    FrameEncoder,
    NatureCNN,
    UserEncoder,
    nature_cnn,
)
from asyncrl.models.obs import Obs, map_obs
from asyncrl.models.registry import AUTO, ENCODERS, IMAGE_ENCODERS, NO_CORE, is_user_encoder, resolve
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

    def __init__(self, spec: EnvSpec, hidden_size: int = 64, normalize_obs: bool = False, encoder: str = AUTO,
                 core: Callable[[int], nn.Module] | None = None, activation: str = "tanh"):
        super().__init__()
        self.discrete = spec.discrete
        self.nvec = spec.nvec  # MultiDiscrete component sizes, () otherwise
        self.parts = spec.parts  # a Tuple action's parts, () otherwise
        image = len(spec.obs_shape) == 3
        self.dict_obs = spec.is_dict
        self.masked = spec.masked  # an `action_mask` key: masks the logits, never reaches the encoder
        self.encoder, self.value_encoder = make_encoders(spec, hidden_size, encoder, shared_value=core is not None,
                                                         activation=activation)
        width = self.encoder.out_features
        if core is not None:  # `core(width)`: between the encoder and both heads (RecurrentActorCritic)
            self.core = core(width)
            width = self.core.out_features
        self.policy_head = _init_linear(nn.Linear(width, spec.num_actions), 0.01)
        self.value_head = _init_linear(nn.Linear(width, 1), 1.0)
        if spec.gaussian_dims:  # a Box action, or a Tuple's Box parts
            self.log_std = nn.Parameter(torch.zeros(spec.gaussian_dims))
        # Frames too, per pixel, as Sample Factory's normalize_input: the CNNs then read standardised pixels (static
        # background near 0, what moves up to +-5) instead of pixels / 255.
        self.obs_normalizer: nn.Module | None = None
        self.image_normalized = normalize_obs and image and not spec.is_dict
        self.frame_keys: frozenset[str] = frozenset()  # a Dict observation's keys normalised per pixel
        if normalize_obs and spec.is_dict:  # one per key; frame keys per pixel
            self.frame_keys = frozenset(k.key for k in spec.feature_keys if k.image)
            self.obs_normalizer = nn.ModuleDict({
                k.key: frame_normalizer(k.shape) if k.image else RunningMeanStd(k.shape) for k in spec.feature_keys})
            cnns = self.encoder.encoders if isinstance(self.encoder, DictEncoder) else {}
            for key in self.frame_keys & set(cnns):
                if isinstance(cnns[key], FrameEncoder):
                    cnns[key].input_scale = 1.0
        elif normalize_obs:
            self.obs_normalizer = frame_normalizer(spec.obs_shape) if image else RunningMeanStd(spec.obs_shape)
            if image and isinstance(self.encoder, FrameEncoder):
                self.encoder.input_scale = 1.0
        self.compute_dtype: torch.dtype | None = None  # encoder autocast dtype (bf16), None for float32
        self.input_ready = False  # inside `prepared_input`: observations come normalised and scaled already
        for encoder in (self.encoder, self.value_encoder):  # a DictEncoder's value MLPs are in self.encoder
            if isinstance(encoder, UserEncoder):  # a user's module keeps its own initialisation
                continue
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

    def prepare_input(self, obs: Obs) -> Obs:
        """The observations as the encoders read them, for `prepared_input`, in the compute dtype (bf16 halves
        float32's copy; the encoders cast to it anyway): normalised (frames standardised per pixel), and the raw
        frames of the built-in CNNs scaled as they would scale them (`obs.to(dtype) * input_scale`: the same bits)."""
        if self.input_ready:
            raise RuntimeError("prepare_input inside prepared_input: prepare the observations before entering it")
        dtype = self.compute_dtype or torch.float32
        out = self._normalized(obs, dtype)
        for key, encoders in self._scaling_frame_encoders().items():
            frames = (out if key is None else out[key]).to(dtype) * encoders[0].input_scale
            out = frames if key is None else {**out, key: frames}
        return out

    @contextlib.contextmanager
    def prepared_input(self) -> Iterator[None]:
        """Within: the observations given are `prepare_input`'s, neither normalised nor scaled again. The learner
        prepares a batch once and trains on it for several epochs (at 3 epochs of 4 minibatches a 1,024-frame Atari
        update standardised or scaled its frames 12 times)."""
        scaling = [e for encoders in self._scaling_frame_encoders().values() for e in encoders]
        scales = [e.input_scale for e in scaling]
        self.input_ready = True
        for encoder in scaling:
            encoder.input_scale = 1.0
        try:
            yield
        finally:
            self.input_ready = False
            for encoder, scale in zip(scaling, scales):
                encoder.input_scale = scale

    def _scaling_frame_encoders(self) -> dict[str | None, list[FrameEncoder]]:
        """The built-in CNNs that scale the env's frames themselves (uint8 / 255), by the observation key they read
        (None: the whole observation); not those reading standardised frames, nor a user's module."""
        if self.dict_obs:
            cnns = self.encoder.encoders if isinstance(self.encoder, DictEncoder) else {}
            return {k: [m] for k, m in cnns.items() if isinstance(m, FrameEncoder) and m.input_scale != 1.0}
        found = [m for m in (self.encoder, self.value_encoder) if isinstance(m, FrameEncoder) and m.input_scale != 1.0]
        return {None: found} if found else {}

    def _normalized(self, obs: Obs, frame_dtype: torch.dtype = torch.float32) -> Obs:
        """Observations through the normaliser: frames standardised per pixel into `frame_dtype`, vectors float32."""
        if self.obs_normalizer is None or self.input_ready:
            return obs
        if isinstance(obs, dict):
            out = dict(obs)
            for k, norm in self.obs_normalizer.items():
                out[k] = (standardize_frames(obs[k], norm, frame_dtype) if k in self.frame_keys
                          else norm.normalize(obs[k].float()))
            return out
        if self.image_normalized:
            return standardize_frames(obs, self.obs_normalizer, frame_dtype)
        return self.obs_normalizer.normalize(obs.float()).float()

    def update_obs_normalizer(self, obs: Obs, mask: torch.Tensor) -> None:
        """Fold the observations where `mask` (their leading dimensions) is True into the normaliser (frames: a
        strided sample of them, `fold_frames`)."""
        if self.obs_normalizer is None:
            return
        if isinstance(obs, dict):
            for k, norm in self.obs_normalizer.items():
                if k in self.frame_keys:
                    fold_frames(norm, obs[k], mask)
                else:
                    norm.update(obs[k][mask])
        elif self.image_normalized:
            fold_frames(self.obs_normalizer, obs, mask)
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


def make_encoders(spec: EnvSpec, hidden_size: int, name: str = AUTO, shared_value: bool = False,
                  activation: str = "tanh") -> tuple[nn.Module, nn.Module | None]:
    """(the policy's encoder, the value's own encoder or None when the value reads the policy's features).

    `name` is `--encoder`: auto (the Nature CNN for images, a policy and a value MLP for vectors and for frames
    smaller than the CNN takes (`EnvSpec.has_image`), one of each per
    key of a Dict observation), nature, impala, mlp (for a Dict observation: what its image keys get), or a
    user's module:callable (`asyncrl/models/registry.py`), shared by policy and value. With `shared_value` (a
    recurrent core, whose output both heads read) no separate value MLP is built."""
    if is_user_encoder(name):
        try:
            factory = resolve(name)
        except (ImportError, AttributeError) as exc:
            raise EncoderError(f"--encoder {name}: cannot load it ({type(exc).__name__}: {exc})") from None
        if not callable(factory):
            raise EncoderError(f"--encoder {name} is not callable; it should be a factory(obs_shape, hidden_size) "
                               f"returning a torch.nn.Module")
        return UserEncoder(name, factory, spec, hidden_size), None
    if spec.is_dict:
        image_encoder = resolve(ENCODERS[name]) if name in ENCODERS else nature_cnn
        return DictEncoder(spec.feature_keys, hidden_size, image_encoder, value_mlps=not shared_value,
                           activation=activation), None
    if len(spec.obs_shape) == 3 and ((name == AUTO and spec.has_image) or name in IMAGE_ENCODERS):
        if name in IMAGE_ENCODERS:
            return resolve(ENCODERS[name])(tuple(spec.obs_shape), hidden_size), None
        return NatureCNN(*spec.obs_shape), None
    width = int(np.prod(spec.obs_shape))
    return MLP(width, hidden_size, activation), None if shared_value else MLP(width, hidden_size, activation)


class RecurrentActorCritic(ActorCritic):
    """The actor-critic with a recurrent core (`--rnn gru|lstm`) between the encoder and the heads: encoder ->
    core -> policy head and value head. Policy and value share the encoder and the core (vectors get no separate
    value MLP: the value needs the memory too).

    Keeps the acting contract itself (`asyncrl.agents.acting.Actor`): `state_layout()` is the core's per-env
    arrays, `act(obs, state, first, greedy)` resets the rows where `first` is set, steps the core once and
    returns the next state. The learner re-runs it over whole trajectories with `unroll`.
    """

    core: RecurrentCore

    def __init__(self, spec: EnvSpec, hidden_size: int = 64, normalize_obs: bool = False, encoder: str = AUTO,
                 rnn: str = "gru", rnn_size: int = 512, rnn_layers: int = 1, activation: str = "tanh"):
        super().__init__(spec, hidden_size, normalize_obs, encoder,
                         core=lambda width: build_core(rnn, width, rnn_size, rnn_layers), activation=activation)

    # ----- the acting contract -----
    def state_layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return self.core.state_layout()

    def initial_state(self, n: int) -> State:
        return self.core.initial_state(n, device=self.policy_head.weight.device)

    @torch.inference_mode()
    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Sampled (as `ActorCritic.act` draws them) or greedy actions, their log-probs, and the state after."""
        out, _, after = self.step(obs, state, first, value=False)
        if greedy:
            actions = greedy_from(out, self.discrete, self.nvec, self.parts)
            return actions, self.distribution(out).log_prob(actions), after
        actions, logp = sample_actions(out, self.discrete, self.nvec, self.parts, getattr(self, "log_std", None))
        return actions, logp, after

    def greedy(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy actions of fresh episodes (from the initial state)."""
        actions, logp, _ = self.act(obs, self.initial_state(_batch_size(obs)), None, greedy=True)
        return actions, logp

    # ----- one step, and whole trajectories -----
    def step(self, obs: Obs, state: State, first: torch.Tensor | None,
             value: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, State]:
        """obs [N, ...], state {k: [N, ...]} -> (policy output [N, A], value [N] (None without `value`), the
        state after the step). Rows where `first` is set start from the initial (zero) state."""
        obs = self._normalized(obs)
        if first is not None:
            state = reset_rows(state, first)
        out, after = self.core(self._features(obs).unsqueeze(0), state)
        return self._policy(out[0], obs), self.value_head(out[0]).squeeze(-1) if value else None, after

    def forward(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [N, ...] -> (policy output, value) of fresh episodes: one step from the initial state."""
        out, values, _ = self.step(obs, self.initial_state(_batch_size(obs)), None)
        return out, values

    def policy_out(self, obs: Obs) -> torch.Tensor:
        return self.step(obs, self.initial_state(_batch_size(obs)), None, value=False)[0]

    def unroll(self, obs: Obs, first: torch.Tensor, initial_state: State,
               cuts: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, dict[int, State]]:
        """Re-run the model over trajectories, time-major: obs [T, B, ...], first [T, B], initial_state {k: [B, ...]}
        -> (policy output [T, B, A], value [T, B], {t: the state before step t's reset}); env b's state is zero
        before every step where `first[t, b]`, as when acting (`RecurrentCore.unroll`). Gradients flow through
        the whole trajectory (the initial state is data)."""
        t_len, b = first.shape
        flat = self._normalized(map_obs(obs, lambda x: x.flatten(0, 1)))
        features = self._features(flat).reshape(t_len, b, -1)
        out, before = self.core.unroll(features, first, initial_state, cuts)
        policy = self._policy(out.flatten(0, 1), flat).reshape(t_len, b, -1)
        return policy, self.value_head(out).squeeze(-1), before

    def features(self, obs: Obs) -> torch.Tensor:
        """obs [N, ...] -> the encoder's float32 features [N, F] (what the core reads), observations normalised."""
        return self._features(self._normalized(obs))

    def _features(self, obs: Obs) -> torch.Tensor:
        """Normalised observations -> the encoder's float32 features."""
        if self.dict_obs:
            return self.encoder(obs, self.compute_dtype)
        return self._encode(self.encoder, obs)

    def _policy(self, core_out: torch.Tensor, obs: Obs) -> torch.Tensor:
        logits = self.policy_head(core_out)
        return apply_action_mask(logits, obs) if self.masked else logits


def _batch_size(obs: Obs) -> int:
    return next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]


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


def build_model(spec: EnvSpec, hidden_size: int = 64, normalize_obs: bool = False, encoder: str = AUTO,
                rnn: str = NO_CORE, rnn_size: int = 512, rnn_layers: int = 1, activation: str = "tanh") -> ActorCritic:
    """The actor-critic for `spec`: feed-forward without `rnn`, a `RecurrentActorCritic` with --rnn gru|lstm.
    EncoderError (one line) for a user's --encoder that cannot be built or does not fit."""
    if rnn == NO_CORE:
        return ActorCritic(spec, hidden_size, normalize_obs, encoder, activation=activation)
    return RecurrentActorCritic(spec, hidden_size, normalize_obs, encoder, rnn, rnn_size, rnn_layers, activation)


def flat_state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers in a fixed order: what the learner publishes to the policy workers."""
    return [t for t in model.state_dict(keep_vars=True).values() if t.dtype.is_floating_point]


def flat_numel(model: nn.Module) -> int:
    return sum(t.numel() for t in flat_state(model))
