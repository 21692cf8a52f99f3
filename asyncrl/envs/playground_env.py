"""MuJoCo Playground's JAX envs (`playground:<env>`, e.g. `playground:CartpoleBalance`; the optional `playground`
extra) as one batched `gymnasium.vector.VectorEnv` per worker split, through the JAX path of `gymnax_env`.

`PlaygroundVectorEnv(env_name, num_envs)` vmaps and jits the env's `reset` and `step` (on JAX's default device:
the CPU here, a GPU where the jax build has one; `to_numpy` hands the CPU's buffers over without a copy, a GPU's
are copied once per step). It auto-resets in the same step (SAME_STEP): Playground's `done` is a termination,
and the env's `episode_length` (its config; `--env-kwargs '{"episode_length": 500}'`) cuts an episode as a
truncation, whose final observation comes in `infos["final_obs"]`. The resets run only on steps where some
episode ended (`lax.cond`). `action_repeat` from the config repeats each action, the rewards summed.

Observations: the env's observation vector; where it gives a dict (the locomotion tasks' "state" and
"privileged_state"), the policy's "state". Actions: a Box in [-1, 1]. `--env-kwargs` set fields of the env's
config (`registry.get_default_config`), e.g. `{"impl": "warp"}`: on the CPU MJX's JAX implementation is the
default here (Playground's is Warp, far slower on a CPU), on a GPU Playground's own.

Processes: as for gymnax, JAX must not start in the process that forks the workers, so the spaces are read in a
fresh process (kept in asyncrl's cache directory, `gymnax_env.cache_dir`) and the envs are made in the workers;
JAX's persistent compilation cache keeps the workers' compiled reset and step.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from asyncrl.envs.base import EnvError, EnvSpec, VecEnv, first_line
from asyncrl.envs.fresh_process import described_in_child, jax_cpu_env
from asyncrl.envs.gymnax_env import _read_spaces, _use_compilation_cache, _write_spaces, cache_dir, to_numpy
from asyncrl.envs.names import PLAYGROUND_PREFIX
from asyncrl.system import install_hint

INSTALL_HINT = install_hint("playground")


def _modules() -> tuple[Any, Any, Any]:
    """(jax, jax.numpy, mujoco_playground.registry), or a one-line EnvError saying how to install the extra."""
    try:
        import jax
        import jax.numpy as jnp
        from mujoco_playground import registry
    except ImportError as e:
        raise EnvError(f"playground: envs need the playground extra ({e}): {INSTALL_HINT}") from None
    _use_compilation_cache(jax)
    return jax, jnp, registry


def _load(env_name: str, env_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Playground's (env, config) with `env_kwargs` set in the config; EnvError for an unknown name or field."""
    registry = _modules()[2]
    names = list(registry.ALL_ENVS)
    if env_name not in names:
        close = difflib.get_close_matches(env_name, names, n=3, cutoff=0.6)
        hint = f"; did you mean: {', '.join(PLAYGROUND_PREFIX + c for c in close)}?" if close else ""
        raise EnvError(f"unknown MuJoCo Playground env {env_name!r}{hint} ({len(names)} envs in "
                       f"mujoco_playground.registry.ALL_ENVS)")
    config = registry.get_default_config(env_name)
    if "impl" in config and "impl" not in env_kwargs and _modules()[0].default_backend() == "cpu":
        config["impl"] = "jax"  # MJX's JAX implementation: 9-11x Warp's steps/s on this CPU (docs/env-backends.md)
    unknown = sorted(set(env_kwargs) - set(config.keys()))
    if unknown:
        raise EnvError(f"--env-kwargs {', '.join(unknown)}: not in {env_name}'s config (it has "
                       f"{', '.join(sorted(config.keys()))})")
    for key, value in env_kwargs.items():
        config[key] = value
    try:
        return registry.load(env_name, config=config), config
    except Exception as e:  # whatever the env's constructor raised, as one line
        raise EnvError(f"cannot make MuJoCo Playground env {env_name!r}: {type(e).__name__}: {first_line(e)}") from e


def _spaces(env_name: str, env_kwargs: dict[str, Any]) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    env, _ = _load(env_name, env_kwargs)
    size = env.observation_size
    if isinstance(size, dict):
        if "state" not in size:
            raise EnvError(f"MuJoCo Playground env {env_name!r} has observations {sorted(size)}, no 'state'")
        size = size["state"]
    shape = (int(size),) if isinstance(size, int) else tuple(int(s) for s in size)
    return (gym.spaces.Box(-np.inf, np.inf, shape, np.float32),
            gym.spaces.Box(-1.0, 1.0, (int(env.action_size),), np.float32))


_SPACES_CHILD = """\
import pickle, sys
out, sys.stdout = sys.stdout.buffer, sys.stderr
from asyncrl.envs.base import EnvError
from asyncrl.envs.playground_env import _spaces
try:
    result = ("ok", _spaces(*pickle.load(sys.stdin.buffer)))
except EnvError as e:
    result = ("error", str(e))
out.write(pickle.dumps(result))
"""


def playground_spaces(env_name: str, **env_kwargs: Any) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """One env's (observation, action) spaces, read in a fresh process (JAX on the CPU) unless this process has
    mujoco_playground already; kept in asyncrl's cache directory."""
    if "mujoco_playground" in sys.modules:
        return _spaces(env_name, env_kwargs)
    path = _cache_path(env_name, env_kwargs)
    cached = _read_spaces(path) if path else None
    if cached is not None:
        return cached
    value = described_in_child(_SPACES_CHILD, (env_name, env_kwargs), f"MuJoCo Playground env {env_name!r}", 600,
                               env=jax_cpu_env())
    if path:
        _write_spaces(path, value)
    return value


def _cache_path(env_name: str, env_kwargs: dict[str, Any]) -> str | None:
    where = cache_dir()
    if where is None:
        return None
    try:
        versions = [importlib.metadata.version(p) for p in ("playground", "jax", "mujoco", "gymnasium")]
        with open(__file__, "rb") as f:
            source = hashlib.sha256(f.read()).hexdigest()
        key = json.dumps([env_name, env_kwargs, versions, source, sys.version], sort_keys=True)
    except (importlib.metadata.PackageNotFoundError, OSError, TypeError, ValueError):
        return None
    return os.path.join(where, "playground-spaces", hashlib.sha256(key.encode()).hexdigest()[:32] + ".pkl")


class PlaygroundVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of Playground env `env_name`, reset and stepped as one jitted, vmapped JAX call."""

    def __init__(self, env_name: str, num_envs: int, seed: int = 0, **env_kwargs: Any) -> None:
        jax, jnp, _ = _modules()
        env, config = _load(env_name, env_kwargs)
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = _spaces(env_name, env_kwargs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self.render_mode = None
        self._jax, self._jnp, self._key, self._state = jax, jnp, jax.random.key(seed), None
        n, limit = num_envs, int(config.episode_length)
        repeat = int(config.get("action_repeat", 1) or 1)
        v_reset, v_step = jax.vmap(env.reset), jax.vmap(env.step)

        def strong(tree: Any) -> Any:  # one dtype per state leaf whatever made it (reset or step): one compile
            return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), tree)

        def observe(state: Any) -> Any:
            obs = state.obs["state"] if isinstance(state.obs, dict) else state.obs
            return obs.astype(jnp.float32)

        def reset(key: Any) -> tuple[Any, ...]:
            key, sub = jax.random.split(key)
            state = strong(v_reset(jax.random.split(sub, n)))
            return key, (state, jnp.zeros(n, jnp.int32)), observe(state)

        def step(key: Any, carry: tuple[Any, Any], action: Any) -> tuple[Any, ...]:
            state, t = carry
            reward = jnp.zeros(n, jnp.float32)
            for _ in range(repeat):
                state = v_step(state, action)
                reward = reward + state.reward.astype(jnp.float32)
            t = t + 1
            terminated = state.done > 0.5
            truncated = (t >= limit) & ~terminated
            done = terminated | truncated
            key, sub = jax.random.split(key)
            state = strong(state)
            fresh = jax.lax.cond(done.any(), lambda: strong(v_reset(jax.random.split(sub, n))), lambda: state)

            def pick(new: Any, old: Any) -> Any:  # per env; a leaf without a row per env (empty) stays
                if jnp.ndim(old) == 0 or jnp.shape(old)[0] != n:
                    return old
                return jnp.where(done.reshape((n,) + (1,) * (jnp.ndim(old) - 1)), new, old)

            final = observe(state)
            state = jax.tree.map(pick, fresh, state)
            return key, (strong(state), jnp.where(done, 0, t)), observe(state), final, reward, terminated, truncated

        self._reset, self._step = jax.jit(reset), jax.jit(step)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; an int `seed` restarts the key stream (same seed, same episodes)."""
        if seed is not None:
            self._key = self._jax.random.key(int(seed))
        self._key, self._state, obs = self._reset(self._key)
        return to_numpy(obs), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("PlaygroundVectorEnv.step before reset")
        action = self._jnp.asarray(np.asarray(actions, dtype=np.float32))
        self._key, self._state, obs, final, reward, terminated, truncated = self._step(self._key, self._state, action)
        terminated, truncated = to_numpy(terminated), to_numpy(truncated)
        ended = terminated | truncated
        infos = {"final_obs": to_numpy(final), "_final_obs": ended} if ended.any() else {}
        return to_numpy(obs), to_numpy(reward), terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        self._state = None


@functools.lru_cache(maxsize=16)
def _spec_cached(name: str, kwargs_json: str) -> EnvSpec:
    from asyncrl.envs.gym_env import spaces_env_spec

    obs, act = playground_spaces(name[len(PLAYGROUND_PREFIX):], **json.loads(kwargs_json))
    return dataclasses.replace(spaces_env_spec(name, obs, act), batched=True)


def _require(name: str) -> None:
    import importlib.util

    if importlib.util.find_spec("mujoco_playground") is None or importlib.util.find_spec("jax") is None:
        raise EnvError(f"{name!r} needs the playground extra (mujoco_playground and jax): {INSTALL_HINT}")


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The registry's `playground:<env>` row: the spec, described in a fresh process; kept per name and arguments."""
    _require(name)
    return _spec_cached(name, json.dumps(env_kwargs or {}, sort_keys=True))


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """The registry's `playground:<env>` row: one jitted batch of `num_envs` envs."""
    _require(name)
    from asyncrl.envs.vector_env import VectorVecEnv

    env_name, kwargs = name[len(PLAYGROUND_PREFIX):], dict(env_kwargs or {})
    return VectorVecEnv(name, lambda n: PlaygroundVectorEnv(env_name, n, **kwargs), num_envs)
