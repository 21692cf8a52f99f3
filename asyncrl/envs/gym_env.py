"""The generic backend: a Python loop over gymnasium envs with same-step auto-reset.

An env instance that raises is closed and replaced by a fresh one (new seed) and the fault recorded in
`faults` for the caller; the other envs carry on. A fresh instance that cannot be made or reset raises
`EnvBroken`.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from asyncrl.envs.base import (
    MASK_KEY,
    EnvBroken,
    EnvError,
    EnvFault,
    EnvSpec,
    EpisodeStats,
    EpisodeTracker,
    ObsKey,
    VecEnv,
    episode_extras,
    tuple_parts,
)

SUPPORTED = ("asyncrl supports Box observation spaces (or a Dict of 3-D image and 1-D vector Boxes) and Discrete, "
             "1-D MultiDiscrete or 1-D Box action spaces, or a Tuple of them - see docs/custom-envs.md")
DICT_SUPPORTED = ("asyncrl supports Dict observations whose values are 3-D image or 1-D vector Box spaces "
                  "- see docs/custom-envs.md")
IMAGE_CHANNELS = (1, 3, 4)


def gym_env_spec(name: str, env: gym.Env) -> EnvSpec:
    """Check `env`'s spaces and describe it; raises EnvError for unsupported spaces.

    A 3-D observation whose last axis is 1, 3 or 4 and whose first is not is taken as a channels-last image:
    the spec says (C, H, W) and the backend transposes each observation once.
    """
    return spaces_env_spec(name, env.observation_space, env.action_space)


def spaces_env_spec(name: str, obs_space: gym.spaces.Space, act_space: gym.spaces.Space) -> EnvSpec:
    """`gym_env_spec` from one env's observation and action spaces (a VectorEnv's single_* spaces)."""
    is_dict = isinstance(obs_space, gym.spaces.Dict)
    if not (isinstance(obs_space, gym.spaces.Box) or is_dict):
        raise EnvError(f"env {name!r} has a {type(obs_space).__name__} observation space; {SUPPORTED}")
    box_action = isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1
    multi_action = isinstance(act_space, gym.spaces.MultiDiscrete) and len(act_space.shape) == 1
    if isinstance(act_space, gym.spaces.Tuple):
        try:
            tuple_parts(act_space)
        except ValueError as exc:
            raise EnvError(f"env {name!r} has {exc}; {SUPPORTED}") from None
    elif not (isinstance(act_space, gym.spaces.Discrete) or box_action or multi_action):
        raise EnvError(f"env {name!r} has a {' '.join(str(act_space).split())} action space; {SUPPORTED}")
    if is_dict:
        keys = tuple(dict_obs_key(name, key, space) for key, space in obs_space.spaces.items())
        if not [k for k in keys if k.key != MASK_KEY]:
            raise EnvError(f"env {name!r} has a Dict observation space with nothing but an action mask; "
                           f"{DICT_SUPPORTED}")
        spec = EnvSpec(name, (), np.dtype(np.float32), act_space, frameskip=1, obs_keys=keys)
        if spec.masked:
            check_action_mask(spec)
        return spec
    shape, dtype, channels_last = _box_layout(obs_space)
    return EnvSpec(name, shape, dtype, act_space, frameskip=1, channels_last=channels_last)


def _box_layout(space: gym.spaces.Box) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(stored shape, stored dtype, channels_last): float Boxes are stored as float32, channels-last images as
    (C, H, W)."""
    dtype = np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else np.dtype(space.dtype)
    shape = tuple(space.shape)
    channels_last = len(shape) == 3 and shape[2] in IMAGE_CHANNELS and shape[0] not in IMAGE_CHANNELS
    if channels_last:
        shape = (shape[2], shape[0], shape[1])
    return shape, dtype, channels_last


def check_action_mask(spec: EnvSpec) -> None:
    """An `action_mask` must cover a Discrete or MultiDiscrete action's logits one for one; else EnvError."""
    if not (spec.discrete or spec.multi_discrete):
        raise EnvError(f"env {spec.name!r} has an {MASK_KEY!r} observation but a "
                       f"{type(spec.action_space).__name__} action space; masks apply to Discrete and MultiDiscrete "
                       f"actions only (drop the key or rename it)")
    mask = next(k for k in spec.obs_keys if k.key == MASK_KEY)
    if mask.shape != (spec.num_actions,):
        what = "one per action" if spec.discrete else "one per choice of each component, sum(nvec)"
        raise EnvError(f"env {spec.name!r} has an {MASK_KEY!r} of shape {mask.shape}; it needs "
                       f"({spec.num_actions},): {what}")


def dict_obs_key(name: str, key: object, space: gym.spaces.Space) -> ObsKey:
    """One Dict entry: a 3-D Box image (uint8 or float) or a 1-D Box vector (stored as float32); else EnvError."""
    if not isinstance(key, str) or not key or "." in key or "/" in key:
        raise EnvError(f"env {name!r} has a Dict observation key {key!r}; keys must be non-empty strings without "
                       f"'.' or '/'")
    if key == MASK_KEY and isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return ObsKey(key, tuple(space.shape), np.dtype(np.float32))
    if isinstance(space, gym.spaces.Box) and len(space.shape) in (1, 3):
        shape, dtype, channels_last = _box_layout(space)
        if len(shape) == 1:
            dtype = np.dtype(np.float32)
        elif dtype not in (np.dtype(np.uint8), np.dtype(np.float32)):
            dtype = np.dtype(np.float32)
        return ObsKey(key, shape, dtype, channels_last)
    raise EnvError(f"env {name!r} has a Dict observation space whose key {key!r} is "
                   f"{' '.join(str(space).split())}; {DICT_SUPPORTED}")


def _training_info_hook(env: gym.Env) -> Callable[[dict], object] | None:
    """The env's `set_training_info` (Sample Factory's TrainingInfoInterface), on it or under its wrappers."""
    hook = getattr(env, "set_training_info", None) or getattr(env.unwrapped, "set_training_info", None)
    return hook if callable(hook) else None


class EnvActions:
    """The policy's actions (a batch of stored rows) as the values an env's `step` takes: indices plus the space's
    start, MultiDiscrete components likewise, Box actions clipped to their bounds, a flat Tuple row as a tuple."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec, space = spec, spec.action_space
        if spec.discrete:
            self._start = int(space.start)
        elif spec.multi_discrete:
            self._multi_start = np.asarray(space.start, dtype=space.dtype)
        elif not spec.is_tuple:
            self._low, self._high = space.low, space.high

    def __call__(self, actions: np.ndarray) -> list:
        spec = self.spec
        if spec.discrete:
            return [int(a) + self._start for a in actions]
        if spec.multi_discrete:
            return list(actions.astype(self._multi_start.dtype) + self._multi_start)
        if spec.is_tuple:
            return [self._tuple_action(a) for a in actions]
        return list(np.clip(actions, self._low, self._high).astype(spec.action_space.dtype))

    def _tuple_action(self, flat: np.ndarray) -> tuple:
        """One env's flat action vector as the Tuple the env takes (indices plus start, Box parts clipped)."""
        out: list = []
        for p in self.spec.parts:
            a = flat[p.offset:p.offset + p.width]
            if p.kind == "discrete":
                out.append(int(round(float(a[0]))) + int(p.space.start))
            elif p.kind == "multi_discrete":
                out.append(np.rint(a).astype(p.space.dtype) + p.space.start)
            else:
                out.append(np.clip(a, p.space.low, p.space.high).astype(p.space.dtype))
        return tuple(out)


class GymVecEnv(VecEnv):
    """`num_envs` envs made by `factory`, stepped one after another in this process."""

    def __init__(self, name: str, factory: Callable[[], gym.Env], num_envs: int) -> None:
        self.num_envs = num_envs
        self._factory = factory
        self.faults: list[EnvFault] = []  # filled by step/reset, emptied by the caller
        self._seed = 0
        self._replaced = 0  # env instances replaced so far (each gets a new seed)
        first = factory()
        try:
            self.spec = gym_env_spec(name, first)
        except EnvError:
            first.close()
            raise
        self.envs = [first] + [factory() for _ in range(num_envs - 1)]
        self._actions = EnvActions(self.spec)
        self._to_chw = self.spec.channels_last
        self._chw_keys = tuple(k.key for k in self.spec.obs_keys if k.channels_last)
        if self.spec.is_dict:
            self._chw = self._chw_dict  # type: ignore[method-assign]
        self.episodes = EpisodeTracker(num_envs)
        self.wants_training_info = _training_info_hook(first) is not None

    def set_training_info(self, info: dict) -> None:
        for env in self.envs:
            hook = _training_info_hook(env)
            if hook is not None:
                hook(dict(info))

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        self._seed = seed
        for i, env in enumerate(self.envs):
            try:
                obs, _ = env.reset(seed=seed + i)
            except Exception as exc:
                obs = self._replace(i, "reset", exc)
            obs_out[i] = self._chw(obs)
        self.episodes.drop()

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        acts = self._actions(actions)
        stats: list[EpisodeStats] = []
        for i, env in enumerate(self.envs):
            try:
                obs, reward, terminated, truncated, info = env.step(acts[i])
                reward = float(reward)
            except Exception as exc:  # the transition is lost; the episode is dropped, not counted
                # The step is marked invalid by the worker (runtime/recovery/rollout_guard.py): the learner cuts the
                # trace there and leaves it out of the loss, so it needs no episode-end flag of its own.
                reward_out[i] = 0.0
                terminated_out[i] = truncated_out[i] = False
                obs_out[i] = self._chw(self._replace(i, "step", exc))
                continue
            reward_out[i] = reward
            self.episodes.add(reward, i)
            cut = bool(truncated and not terminated)
            terminated_out[i] = bool(terminated)
            truncated_out[i] = cut
            if terminated or truncated:
                stats.append(self.episodes.end(i, cut, episode_extras(info, self.info_keys)))
                if cut:
                    final_obs_out[i] = self._chw(obs)
                try:
                    obs, _ = env.reset()
                except Exception as exc:
                    obs = self._replace(i, "reset", exc)
            obs_out[i] = self._chw(obs)
        return stats

    def _chw(self, obs: np.ndarray) -> np.ndarray:
        """A channels-last image as (C, H, W) (a view: the copy is the write into the slot); else as is."""
        return np.moveaxis(obs, 2, 0) if self._to_chw else obs

    def _chw_dict(self, obs: dict) -> dict:
        """A Dict observation with each channels-last image key as (C, H, W) views."""
        if not self._chw_keys:
            return obs
        return {k: np.moveaxis(v, 2, 0) if k in self._chw_keys else v for k, v in obs.items()}

    def _replace(self, i: int, where: str, exc: Exception) -> np.ndarray:
        """Close env i, make and reset a fresh instance in its place, record the fault; its first observation."""
        self.faults.append(EnvFault(i, where, f"{type(exc).__name__}: {exc}"))
        try:
            self.envs[i].close()
        except Exception:  # a broken env may fail to close too; it is dropped either way
            pass
        self._replaced += 1
        stage = "creating"
        try:
            fresh = self._factory()
            stage = "resetting"
            obs, _ = fresh.reset(seed=self._seed + self.num_envs * self._replaced + i)
        except Exception as new_exc:
            raise EnvBroken(f"{self.spec.name} env raised {type(exc).__name__}: {exc} in {where}, and a fresh "
                            f"instance failed before its first step ({stage} it: {type(new_exc).__name__}: "
                            f"{new_exc})") from None
        self.envs[i] = fresh
        self.episodes.drop(i)
        return obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
