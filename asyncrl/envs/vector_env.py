"""The batched backend: one `gymnasium.vector.VectorEnv` per worker split, its arrays written straight into the slots.

A VectorEnv steps all its envs in one call (gymnasium's `vector_entry_point` envs such as CartPole-v1's numpy
implementation, a user's `module:callable` returning one, JAX envs through `asyncrl.envs.gymnax_env`). Every
gymnasium autoreset mode maps onto the slots' same-step contract (`asyncrl.envs.base`):

- SAME_STEP: the env returns the next episode's first observation at an episode end and the one it reached in
  `info["final_obs"]`, which is what a truncation bootstraps from.
- NEXT_STEP (gymnasium's default): the env returns the observation it reached at an episode end, and its next
  step ignores the action and returns the next episode's first observation with reward 0. That reset step is
  written into the slot like any other but flagged in `skipped`: the rollout worker marks it invalid (never
  trained on), does not count it as an agent step, and starts the episode at the observation it wrote.
- DISABLED: the backend resets the ended envs itself (`reset(options={"reset_mask": ...})`) in the same step.

Episode returns and lengths are kept as arrays; the only Python loop is over the envs whose episode just ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from asyncrl.envs.base import EnvError, EnvSpec, EpisodeStats, EpisodeTracker, VecEnv, episode_extras
from asyncrl.envs.dict_obs import ArrayDict
from asyncrl.envs.gym_env import spaces_env_spec


def autoreset_mode(env: gym.vector.VectorEnv) -> AutoresetMode:
    """The env's autoreset mode (gymnasium's default, NEXT_STEP, when its metadata does not say)."""
    mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    try:
        return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)
    except ValueError:
        raise EnvError(f"env has autoreset_mode {mode!r} in its metadata; gymnasium's modes are "
                       f"{', '.join(m.value for m in AutoresetMode)}") from None


def check_vector_env(name: str, env: object, num_envs: int) -> gym.vector.VectorEnv:
    """`env` itself when it is a VectorEnv of `num_envs` envs; else EnvError (one line)."""
    if not isinstance(env, gym.vector.VectorEnv):
        raise EnvError(f"{name!r} returned a {type(env).__name__}, neither a gymnasium.Env nor a "
                       f"gymnasium.vector.VectorEnv")
    if env.num_envs != num_envs:
        env.close()
        raise EnvError(f"{name!r} returned a VectorEnv of {env.num_envs} envs where {num_envs} were asked for; "
                       f"give the callable a num_envs argument, or set --envs-per-worker to {env.num_envs} x "
                       f"--worker-splits")
    return env


def vector_env_spec(name: str, env: gym.vector.VectorEnv) -> EnvSpec:
    """The spec of one of `env`'s envs (its single_* spaces), marked batched."""
    return dataclasses.replace(spaces_env_spec(name, env.single_observation_space, env.single_action_space),
                               batched=True)


class VectorVecEnv(VecEnv):
    """A gymnasium VectorEnv made by `make(num_envs)`, stepped as one batch."""

    def __init__(self, name: str, make: Callable[[int], object], num_envs: int) -> None:
        self.num_envs = num_envs
        self.env = check_vector_env(name, make(num_envs), num_envs)
        try:
            self.spec = vector_env_spec(name, self.env)
            self.mode = autoreset_mode(self.env)
        except EnvError:
            self.env.close()
            raise
        self.skipped = np.zeros(num_envs, dtype=bool)
        self._ended = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: these envs' next step is their reset
        self.episodes = EpisodeTracker(num_envs)
        self._action = self._action_converter(self.env.single_action_space)
        self._keys = tuple(k.key for k in self.spec.obs_keys)
        self._chw_keys = frozenset(k.key for k in self.spec.obs_keys if k.channels_last)

    def reset(self, seed: int, obs_out: np.ndarray | ArrayDict) -> None:
        obs, _ = self.env.reset(seed=seed)  # env i gets seed + i
        self._write(obs_out, obs)
        self.episodes.drop()
        self._ended[:] = False
        self.skipped[:] = False

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray | ArrayDict, reward_out: np.ndarray,
        terminated_out: np.ndarray, truncated_out: np.ndarray, final_obs_out: np.ndarray | ArrayDict,
    ) -> list[EpisodeStats]:
        obs, reward, terminated, truncated, info = self.env.step(self._action(actions))
        np.copyto(self.skipped, self._ended)
        np.copyto(reward_out, reward, casting="unsafe")
        np.copyto(terminated_out, terminated, casting="unsafe")
        np.logical_and(truncated, ~terminated_out, out=truncated_out)
        if self.mode is AutoresetMode.NEXT_STEP and self._ended.any():  # reset steps: no reward, no episode end
            reward_out[self.skipped] = 0.0
            terminated_out[self.skipped] = truncated_out[self.skipped] = False
        ended = np.logical_or(terminated_out, truncated_out)
        if self.mode is AutoresetMode.NEXT_STEP:
            np.copyto(self._ended, ended)
        self.episodes.add(reward_out, steps=~self.skipped)
        self._write(obs_out, obs)
        if not ended.any():
            return []
        cut = np.flatnonzero(truncated_out)
        if self.mode is AutoresetMode.SAME_STEP:
            self._write_rows(final_obs_out, cut, info.get("final_obs"), "info['final_obs']")
        else:
            self._write_rows(final_obs_out, cut, obs, "its observation")
            if self.mode is AutoresetMode.DISABLED:
                fresh, _ = self.env.reset(options={"reset_mask": ended})
                rows = np.flatnonzero(ended)
                self._write_rows(obs_out, rows, fresh, "the reset observation")
        rows = np.flatnonzero(ended)
        stats = self.episodes.end_many(rows, truncated_out[rows])
        if info:
            for i, episode in zip(rows.tolist(), stats):
                episode.extra = episode_extras(_env_info(info, i), self.info_keys)
        return stats

    def close(self) -> None:
        self.env.close()

    def _write(self, out: np.ndarray | ArrayDict, obs: Any) -> None:
        """The batch's observations into `out` (channels-last images moved to channels first)."""
        if self._keys:
            for k in self._keys:
                out[k][...] = np.moveaxis(obs[k], 3, 1) if k in self._chw_keys else obs[k]
        elif self.spec.channels_last:
            out[...] = np.moveaxis(obs, 3, 1)
        else:
            out[...] = obs

    def _write_rows(self, out: np.ndarray | ArrayDict, rows: np.ndarray, obs: Any, what: str) -> None:
        """Rows `rows` of a batch of observations (or of gymnasium's per-env object array) into `out`."""
        if not len(rows):
            return
        if obs is None:
            raise EnvError(f"{self.spec.name} ended episodes without {what} (SAME_STEP autoreset must report it)")
        for i in rows:
            one = {k: _row(obs[k], i) for k in self._keys} if self._keys else _row(obs, i)
            if self._keys:
                for k in self._keys:
                    out[k][i] = np.moveaxis(one[k], 2, 0) if k in self._chw_keys else one[k]
            else:
                out[i] = np.moveaxis(one, 2, 0) if self.spec.channels_last else one

    def _action_converter(self, space: gym.spaces.Space) -> Callable[[np.ndarray], Any]:
        """Slot actions (indices from 0, floats) as the batch the VectorEnv takes."""
        if isinstance(space, gym.spaces.Discrete):
            start, dtype = int(space.start), space.dtype
            return lambda a: (a + start).astype(dtype, copy=False)
        if isinstance(space, gym.spaces.MultiDiscrete):
            start = np.asarray(space.start, dtype=space.dtype)
            return lambda a: a.astype(space.dtype) + start
        if isinstance(space, gym.spaces.Box):
            low, high = space.low, space.high
            return lambda a: np.clip(a, low, high).astype(space.dtype, copy=False)
        parts = self.spec.parts  # a Tuple of them

        def tuple_action(a: np.ndarray) -> tuple:
            out = []
            for p in parts:
                cols = a[:, p.offset:p.offset + p.width]
                if p.kind == "discrete":
                    out.append(np.rint(cols[:, 0]).astype(p.space.dtype) + int(p.space.start))
                elif p.kind == "multi_discrete":
                    out.append(np.rint(cols).astype(p.space.dtype) + p.space.start)
                else:
                    out.append(np.clip(cols, p.space.low, p.space.high).astype(p.space.dtype))
            return tuple(out)

        return tuple_action


def _row(batch: Any, i: int) -> Any:
    """Env i's entry of a batch array or of gymnasium's per-env object array."""
    return np.asarray(batch[i])


def _env_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env i's entries of a VectorEnv info dict (each key's `_key` mask says which envs have it)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        out[key] = _env_info(value, i) if isinstance(value, dict) else value[i]
    final = info.get("final_info")
    if isinstance(final, dict) and (info.get("_final_info") is None or info["_final_info"][i]):
        out.update(_env_info(final, i))  # SAME_STEP: the ended episode's own info
    return out
