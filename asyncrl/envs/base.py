"""The batched environment interface every backend implements.

A rollout worker owns one or more `VecEnv`s. Each `step` writes its results straight into arrays the caller
provides (views into the shared trajectory buffer), so a backend never allocates per step on the hot path.
Auto-reset is "same step": when an env's episode ends at step t, `obs_out[i]` already holds the first
observation of the next episode. An episode ends either by a termination (`terminated_out[i]`: the MDP
reached a terminal state, its value is 0) or by a truncation (`truncated_out[i]`: a time limit cut it, and
the state it reached still has a value). For a truncation the backend also writes the observation the env
reached (before the reset) into `final_obs_out[i]`, so the learner can bootstrap from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np


class EnvError(ValueError):
    """A user-facing problem with an env name or an env's spaces (reported as one line, exit code 2)."""


@dataclass(frozen=True)
class ObsKey:
    """One entry of a Dict observation: a 3-D image (channels first as stored) or a 1-D vector (float32)."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    channels_last: bool = False  # the env returns this key's image as (H, W, C); shape is (C, H, W)

    @property
    def image(self) -> bool:
        return len(self.shape) == 3


@dataclass(frozen=True)
class ActionPart:
    """One part of a Tuple action, laid out in the flat action vector and the flat policy output.

    `kind` is "discrete" (one index), "multi_discrete" (one index per component) or "box" (a 1-D vector).
    `width` entries of the flat action, starting at `offset`; `out_width` entries of the policy output (logits,
    or Gaussian means), starting at `out_offset`.
    """

    kind: str
    space: gym.spaces.Space
    offset: int
    width: int
    out_offset: int
    out_width: int

    @property
    def nvec(self) -> tuple[int, ...]:
        if self.kind == "discrete":
            return (int(self.space.n),)
        return tuple(int(n) for n in self.space.nvec) if self.kind == "multi_discrete" else ()


def tuple_parts(space: gym.spaces.Tuple) -> tuple[ActionPart, ...]:
    """The layout of a Tuple of Discrete, 1-D MultiDiscrete and 1-D Box spaces (ValueError for anything else)."""
    parts, offset, out_offset = [], 0, 0
    for sub in space.spaces:
        if isinstance(sub, gym.spaces.Discrete):
            kind, width, out_width = "discrete", 1, int(sub.n)
        elif isinstance(sub, gym.spaces.MultiDiscrete) and len(sub.shape) == 1:
            kind, width, out_width = "multi_discrete", len(sub.nvec), int(sum(sub.nvec))
        elif isinstance(sub, gym.spaces.Box) and len(sub.shape) == 1:
            kind, width, out_width = "box", int(sub.shape[0]), int(sub.shape[0])
        else:
            raise ValueError(f"a Tuple action whose part {' '.join(str(sub).split())} is not a Discrete, 1-D "
                             f"MultiDiscrete or 1-D Box space")
        parts.append(ActionPart(kind, sub, offset, width, out_offset, out_width))
        offset, out_offset = offset + width, out_offset + out_width
    if not parts:
        raise ValueError("an empty Tuple action space")
    return tuple(parts)


MIN_CNN_FRAME = 36  # the Nature CNN's smallest input (8x8 stride 4, 4x4 stride 2, 3x3 stride 1)
MASK_KEY = "action_mask"  # a Dict observation's key of allowed actions (1 = allowed), as Sample Factory and PettingZoo


@dataclass(frozen=True)
class EnvSpec:
    """What the buffers and the model need to know about an env.

    A Dict observation has `obs_keys` (one entry per key, in the space's order); its `obs_shape` is () and its
    `obs_dtype` float32, placeholders that nothing sized from them may use (check `is_dict` first).
    """

    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_space: gym.spaces.Space  # Discrete, 1-D MultiDiscrete or 1-D Box
    frameskip: int  # emulator frames per agent step (1 for non-Atari envs)
    channels_last: bool = False  # the env returns (H, W, C) images; obs_shape is (C, H, W), the backend transposes
    obs_keys: tuple[ObsKey, ...] = ()  # a Dict observation's keys; () for a Box observation
    batched: bool = False  # stepped as one gymnasium VectorEnv per worker split (asyncrl/envs/vector_env.py)
    fixed_num_envs: int = 0  # a VectorEnv callable without a num_envs argument always makes this many (0: any)
    num_agents: int = 1  # a multi-agent env's agents per instance, each an env column (asyncrl/envs/multi_agent.py)

    @property
    def is_dict(self) -> bool:
        return bool(self.obs_keys)

    @property
    def masked(self) -> bool:
        """Its Dict observation has an `action_mask`: the policy never picks an action the mask forbids."""
        return any(k.key == MASK_KEY for k in self.obs_keys)

    @property
    def feature_keys(self) -> tuple[ObsKey, ...]:
        """The Dict keys the encoder reads: all but the action mask."""
        return tuple(k for k in self.obs_keys if k.key != MASK_KEY)

    @property
    def has_image(self) -> bool:
        """Image observations (a 3-D Box of frames at least MIN_CNN_FRAME on a side, or a Dict with at least one
        image key): the CNN is in the model. Smaller grids (MinAtar's 10 x 10) go to the MLP, flattened."""
        if self.is_dict:
            return any(k.image for k in self.obs_keys)
        return len(self.obs_shape) == 3 and min(self.obs_shape[1:]) >= MIN_CNN_FRAME

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Discrete)

    @property
    def multi_discrete(self) -> bool:
        """Several independent discrete choices per step (a 1-D MultiDiscrete space)."""
        return isinstance(self.action_space, gym.spaces.MultiDiscrete)

    @property
    def is_tuple(self) -> bool:
        """A Tuple action (Discrete, MultiDiscrete and Box parts), stored as one flat float32 vector."""
        return isinstance(self.action_space, gym.spaces.Tuple)

    @property
    def parts(self) -> tuple[ActionPart, ...]:
        """A Tuple action's parts; () for other action spaces."""
        return tuple_parts(self.action_space) if self.is_tuple else ()

    @property
    def nvec(self) -> tuple[int, ...]:
        """The choices of each MultiDiscrete component; () for other action spaces."""
        return tuple(int(n) for n in self.action_space.nvec) if self.multi_discrete else ()

    @property
    def action_shape(self) -> tuple[int, ...]:
        if self.is_tuple:
            return (sum(p.width for p in self.parts),)
        return () if self.discrete else tuple(self.action_space.shape)

    @property
    def action_dtype(self) -> np.dtype:
        return np.dtype(np.int64) if self.discrete or self.multi_discrete else np.dtype(np.float32)

    @property
    def num_actions(self) -> int:
        """Logits for discrete spaces (all components' for MultiDiscrete); action dimensions for Box spaces."""
        if self.discrete:
            return int(self.action_space.n)
        if self.is_tuple:
            return sum(p.out_width for p in self.parts)
        return sum(self.nvec) if self.multi_discrete else int(np.prod(self.action_space.shape))

    @property
    def gaussian_dims(self) -> int:
        """How many action dimensions a diagonal Gaussian draws: a Box action's, or a Tuple's Box parts'."""
        if self.is_tuple:
            return sum(p.width for p in self.parts if p.kind == "box")
        return 0 if self.discrete or self.multi_discrete else self.num_actions


@dataclass
class EpisodeStats:
    """One finished full episode: the raw (unclipped, whole-game) return, its length in agent steps, and whether
    a time limit cut it (truncated) rather than the env ending it (terminated)."""

    ret: float
    length: int
    truncated: bool = False
    extra: dict[str, float] | None = None  # the env's own episode metrics (see `episode_extras`), if any
    env: int = -1  # the env column it was played in (which policy played it, with --num-policies); -1: unknown


class EpisodeTracker:
    """Each env's running episode, its raw return and its length in agent steps, and its `EpisodeStats` when it
    ends (the one bookkeeping every backend shares)."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def add(self, rewards: float | np.ndarray, envs: int | slice = slice(None), steps: int | np.ndarray = 1) -> None:
        """One step of `envs` (all by default): its raw rewards, counted as `steps` agent steps (0 where a row was
        not an agent step)."""
        self.returns[envs] += rewards
        self.lengths[envs] += steps

    def drop(self, envs: int | slice | np.ndarray = slice(None)) -> None:
        """Forget the unfinished episodes of `envs` (all by default): a reset, or a replaced env."""
        self.returns[envs] = 0.0
        self.lengths[envs] = 0

    def end(self, i: int, truncated: bool, extra: dict[str, float] | None = None) -> EpisodeStats:
        """Env i's episode ends (cut by a time limit where `truncated`): its stats; the next one starts at zero."""
        stats = EpisodeStats(float(self.returns[i]), int(self.lengths[i]), bool(truncated), extra, env=int(i))
        self.drop(i)
        return stats

    def end_many(self, envs: np.ndarray, truncated: np.ndarray) -> list[EpisodeStats]:
        """The episodes of `envs` (indices) end, `truncated[k]` saying whether envs[k]'s was cut."""
        return [self.end(int(i), bool(cut)) for i, cut in zip(envs.tolist(), truncated.tolist())]


def close_env(env: object) -> None:
    """Call an env's `close()` where it has one: PettingZoo-style and Sample Factory-style multi-agent envs
    written by users may leave it out."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def first_line(exc: BaseException) -> str:
    """An exception's message, its first line only (for one-line errors)."""
    return (str(exc).splitlines() or [""])[0]


EXTRA_STATS = "episode_extra_stats"  # Sample Factory's info key: a dict of numbers at an episode's end


class EnvInfoError(EnvError):
    """An env's info held a non-number where a metric was expected: bad input, the run stops (exit code 2)."""


def episode_extras(info: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float] | None:
    """The metrics an episode's last step info reports: every entry of `info["episode_extra_stats"]` and the
    `keys` (--info-keys) present in `info`; None when there are none. Called at episode ends only."""
    out: dict[str, float] = {}
    for key, value in (info.get(EXTRA_STATS) or {}).items():
        out[str(key)] = _number(value, f"info[{EXTRA_STATS!r}][{key!r}]")
    for key in keys:
        if key in info:
            out[key] = _number(info[key], f"info[{key!r}] (--info-keys)")
    return out or None


def _number(value: Any, where: str) -> float:
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, bool | int | float | np.number):
        return float(value)
    raise EnvInfoError(f"{where} is a {type(value).__name__}, not a number; env metrics must be numbers (drop the "
                       f"key from --info-keys or report a number)")


class VecEnv(ABC):
    """A batch of `num_envs` environments stepped together."""

    num_envs: int
    spec: EnvSpec
    info_keys: tuple[str, ...] = ()  # --info-keys: numeric step-info keys recorded at episode ends, where supported
    wants_training_info: bool = False  # its envs define set_training_info(info): a curriculum (see below)
    # Rows whose last `step` was not an agent step but the env's own reset (a gymnasium VectorEnv in NEXT_STEP
    # autoreset mode ignores that step's action and returns the next episode's first observation): the caller
    # leaves them out of training (invalid), does not count them as env steps, and starts an episode at the
    # observation they wrote. None, or all False, for backends that reset in the same step.
    skipped: np.ndarray | None = None

    def set_training_info(self, info: dict[str, Any]) -> None:
        """Pass the run's progress (frames, env_steps, policy_version, episode_return_mean) to every env that
        defines `set_training_info`; called at most once per report interval. Backends without such envs ignore
        it."""
        return None

    @abstractmethod
    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        """Reset every env (env i seeded with seed + i; a batched backend seeds its batch with seed) and write
        observations into obs_out[num_envs, ...]."""

    @abstractmethod
    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        """Step every env once; write next obs, training rewards and episode-end flags; return finished episodes.

        `reward_out` gets the training reward (clipped for Atari in training mode). `terminated_out` is True
        where the env reached a terminal state (and, for Atari in training mode, on a life loss);
        `truncated_out` is True where a time limit cut the episode and it did not terminate (never both).
        Where `truncated_out[i]`, `final_obs_out[i]` gets the observation the env reached before its reset;
        the other rows of `final_obs_out` are left untouched. The returned stats are for whole games with raw
        rewards, whatever training-mode shaping was applied.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the envs' resources."""


@dataclass
class EnvFault:
    """An env instance raised and was replaced by a fresh one (reported by backends that can do that).

    `where` is "step" (the step's transition is lost: its reward and next observation never came, so the
    learner must leave it out) or "reset" (the step itself was fine; the automatic reset after it failed).
    Either way the env's unfinished episode is dropped and `obs_out[index]` holds the fresh instance's first
    observation. A failed step sets no episode-end flag: the rollout worker marks it invalid, and the learner
    cuts the trace there (see `asyncrl.algo.time_limits`).
    """

    index: int
    where: str
    message: str


class EnvBroken(RuntimeError):
    """A freshly created env instance cannot be made or fails before its first step: retrying will not help."""
