"""gymnax's JAX environments (MinAtar, classic control, bsuite, ...) as one batched `gymnasium.vector.VectorEnv`.

`GymnaxVectorEnv(env_id, num_envs)` holds `num_envs` copies of a gymnax env as one vmapped, jitted JAX reset and
step (the optional `gymnax` extra: `pip install 'asyncrl[gymnax]'`). It auto-resets in the same step
(`AutoresetMode.SAME_STEP`) and keeps gymnax's termination apart from its time-limit truncation.

Processes: JAX's runtime is multithreaded and does not survive a fork; a forked child that uses JAX after its
parent initialised it hangs. Importing gymnax initialises it, so a process that forks workers must not import
gymnax nor make a `GymnaxVectorEnv` itself: make the envs in the workers, and describe an env in the parent with
`gymnax_spaces`, which asks a fresh Python process. This module imports JAX and gymnax only when they are used.

Devices: JAX runs on its default device (the CPU with the CPU jax wheel; `JAX_PLATFORMS=cpu` keeps it there when
a GPU jax is installed). On the CPU the arrays returned are zero-copy, read-only numpy views of JAX's buffers
(`to_numpy`). On a GPU every step copies its results to the host; a GPU consumer would rather wrap the JAX arrays
with `torch.from_dlpack` on the same device (zero-copy there), and JAX should then not preallocate the GPU's
memory (`XLA_PYTHON_CLIENT_PREALLOCATE=false`) when torch shares it.

Start-up: describing an env costs a fresh process (importing JAX and gymnax, 2-3 s of CPU), and every worker
compiles its reset and step. Both are kept in asyncrl's cache directory (`cache_dir()`): the spaces of each
(env, arguments, package versions, this module) and JAX's persistent compilation cache, so a run of an env
described and compiled before starts without either. `ASYNCRL_CACHE_DIR=off` turns both off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from asyncrl.envs.base import EnvError, EnvSpec, VecEnv
from asyncrl.envs.fresh_process import described_in_child, jax_cpu_env
from asyncrl.system import install_hint

if TYPE_CHECKING:
    import jax

INSTALL_HINT = install_hint("gymnax")


def _jax_modules() -> tuple[Any, Any, Any]:
    """(gymnax, jax, jax.numpy), or a one-line EnvError saying how to install the extra."""
    try:
        import gymnax
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise EnvError(f"gymnax envs need JAX and gymnax ({e}): {INSTALL_HINT}") from None
    _use_compilation_cache(jax)
    return gymnax, jax, jnp


def cache_dir() -> str | None:
    """asyncrl's cache directory: `$ASYNCRL_CACHE_DIR`, else `$XDG_CACHE_HOME/asyncrl`, else `~/.cache/asyncrl`;
    None when `ASYNCRL_CACHE_DIR=off`."""
    chosen = os.environ.get("ASYNCRL_CACHE_DIR")
    if chosen == "off":
        return None
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "asyncrl")


def _use_compilation_cache(jax: Any) -> None:
    """JAX's persistent compilation cache in `cache_dir()/jax`, unless JAX was given one or the cache is off.
    Every compilation is kept (JAX's default keeps only those over a second; a worker's reset and step take less
    at XLA's lowest optimisation level, and recompiling them is what a run's start pays)."""
    where = cache_dir()
    if where is None or jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    jax.config.update("jax_compilation_cache_dir", os.path.join(where, "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def to_numpy(x: jax.Array) -> np.ndarray:
    """`x` as a numpy array, zero-copy where JAX's buffer is in host memory.

    For an array on the CPU the result is a read-only view of JAX's buffer that keeps the buffer alive while the
    view lives: no copy. `np.from_dlpack(x)` gives the same view but costs about 20 times as long per array
    (some 60 us against 3 us here), so the step uses `np.asarray`. An array on a GPU is copied to the host once;
    a consumer on that GPU avoids the copy with `torch.from_dlpack(x)` (a tensor on the same device, zero-copy).
    """
    return np.asarray(x)


def _gym_space(space: Any, what: str, env_id: str, channels_first: bool = False) -> gym.spaces.Space:
    """A gymnax Discrete or Box space as gymnasium's (Box as float32); EnvError for the others."""
    from gymnax.environments import spaces

    if isinstance(space, spaces.Discrete):
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, spaces.Box):
        shape = tuple(int(s) for s in space.shape)
        low, high = (np.broadcast_to(np.asarray(b, dtype=np.float32), shape) for b in (space.low, space.high))
        if channels_first and len(shape) == 3:
            low, high = np.moveaxis(low, 2, 0), np.moveaxis(high, 2, 0)
        return gym.spaces.Box(np.ascontiguousarray(low), np.ascontiguousarray(high), dtype=np.float32)
    raise EnvError(f"gymnax env {env_id!r} has a {type(space).__name__} {what} space; GymnaxVectorEnv supports "
                   f"Discrete and Box spaces")


def _make(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """gymnax's (env, params): `env_kwargs` that name an EnvParams field go to the params, the rest to the env."""
    gymnax = _jax_modules()[0]
    if env_id not in gymnax.registered_envs:
        raise EnvError(f"{env_id!r} is not a gymnax env; gymnax has {', '.join(gymnax.registered_envs)}")
    env, params = _call_make(gymnax, env_id, {})
    fields = {f.name for f in dataclasses.fields(params)}
    param_kwargs = {k: v for k, v in env_kwargs.items() if k in fields}
    ctor_kwargs = {k: v for k, v in env_kwargs.items() if k not in fields}
    if ctor_kwargs:
        takes = set(inspect.signature(type(env).__init__).parameters) - {"self"}
        unknown = sorted(set(ctor_kwargs) - takes)
        if unknown:
            raise EnvError(f"gymnax env {env_id!r} takes no {', '.join(unknown)}; its params are "
                           f"{', '.join(sorted(fields))}; its constructor takes "
                           f"{', '.join(sorted(takes)) or 'nothing'}")
        env, _ = _call_make(gymnax, env_id, ctor_kwargs)
    return env, params.replace(**param_kwargs) if param_kwargs else params


def _call_make(gymnax: Any, env_id: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    try:
        return gymnax.make(env_id, **kwargs)
    except Exception as e:  # whatever the env's constructor raised, as one line
        first = (str(e).splitlines() or [""])[0]
        raise EnvError(f"cannot make gymnax env {env_id!r}: {type(e).__name__}: {first}") from e


def _spaces(env_id: str, channels_first: bool, env_kwargs: dict[str, Any]) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    env, params = _make(env_id, env_kwargs)
    return (_gym_space(env.observation_space(params), "observation", env_id, channels_first),
            _gym_space(env.action_space(params), "action", env_id))


_SPACES_CHILD = """\
import pickle, sys
out_file, sys.stdout = sys.stdout.buffer, sys.stderr  # only the answer on stdout
from asyncrl.envs.base import EnvError
from asyncrl.envs.gymnax_env import _spaces
try:
    out = ("ok", _spaces(*pickle.load(sys.stdin.buffer)))
except EnvError as e:
    out = ("error", str(e))
out_file.write(pickle.dumps(out))
"""


def gymnax_spaces(env_id: str, *, channels_first: bool = False,
                  **env_kwargs: Any) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """One env's (observation, action) spaces as `GymnaxVectorEnv(env_id, n, **same)` has them.

    Computed in a fresh Python process (JAX on the CPU; a few seconds) so that this process stays safe to fork,
    or here when this process already imported gymnax. EnvError for an unknown id, kwarg or space.
    """
    if "gymnax" in sys.modules:
        return _spaces(env_id, channels_first, env_kwargs)
    path = _spaces_cache_path(env_id, channels_first, env_kwargs)
    cached = _read_spaces(path) if path else None
    if cached is not None:
        return cached
    spaces = _described(env_id, channels_first, env_kwargs)
    if path:
        _write_spaces(path, spaces)
    return spaces


def _described(env_id: str, channels_first: bool,
               env_kwargs: dict[str, Any]) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    return described_in_child(_SPACES_CHILD, (env_id, channels_first, env_kwargs), f"gymnax env {env_id!r}", 600,
                              env=jax_cpu_env())


def _spaces_cache_path(env_id: str, channels_first: bool, env_kwargs: dict[str, Any]) -> str | None:
    """Where the spaces of these arguments are kept: named by a hash of them, of the versions of the packages
    that make the spaces, and of this module's source; None when the cache is off or the arguments are not JSON."""
    where = cache_dir()
    if where is None:
        return None
    try:
        versions = [importlib.metadata.version(p) for p in ("gymnax", "jax", "gymnasium", "numpy")]
        with open(__file__, "rb") as f:
            source = hashlib.sha256(f.read()).hexdigest()
        key = json.dumps([env_id, channels_first, env_kwargs, versions, source, sys.version], sort_keys=True)
    except (importlib.metadata.PackageNotFoundError, OSError, TypeError, ValueError):
        return None
    return os.path.join(where, "gymnax-spaces", hashlib.sha256(key.encode()).hexdigest()[:32] + ".pkl")


def _read_spaces(path: str) -> tuple[gym.spaces.Space, gym.spaces.Space] | None:
    try:
        with open(path, "rb") as f:
            spaces = pickle.load(f)
    except Exception:  # missing, unreadable or damaged: described again (and rewritten)
        return None
    ok = isinstance(spaces, tuple) and len(spaces) == 2 and all(isinstance(s, gym.spaces.Space) for s in spaces)
    return spaces if ok else None


def _write_spaces(path: str, spaces: tuple[gym.spaces.Space, gym.spaces.Space]) -> None:
    """Written whole or not at all (a temporary file renamed); a cache that cannot be written is skipped."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(spaces, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class GymnaxVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of gymnax env `env_id`, reset and stepped as one jitted, vmapped JAX call.

    `env_kwargs` naming a field of the env's EnvParams (e.g. `max_steps_in_episode`) set that parameter; the
    others go to the env's constructor (e.g. MinAtar's `use_minimal_action_set`). Observations are float32
    numpy arrays [num_envs, ...], MinAtar's images channels last (H, W, C) as gymnax makes them, or (C, H, W) with
    `channels_first=True`. Discrete actions are indices from 0 (Discrete(n)); Box actions float32.

    Episode ends: gymnax's `step_env` reports natural termination alone, and `env.is_truncated(state, params)`
    the time limit (`state.time >= params.max_steps_in_episode`, time counting the steps taken). An env is
    `terminated` when `step_env` says so, and `truncated` when it reached the time limit without terminating
    (a terminal state reached on the last allowed step is a termination, whose value is 0). Either way its
    episode ends: SAME_STEP autoreset returns the next episode's first observation in `obs`, and the observation
    reached before the reset in `infos["final_obs"]` (all envs' rows [num_envs, ...]; the ended ones are marked
    in the bool mask `infos["_final_obs"]`). Both keys are there only on steps where some episode ended.

    Keys: the object keeps a JAX PRNG key, split inside each jitted call (one split for the step, one for the
    resets); `reset(seed=s)` restarts it from `jax.random.key(s)`, so the same seed gives the same episodes.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, *, channels_first: bool = False,
                 **env_kwargs: Any) -> None:
        _, jax, jnp = _jax_modules()
        if num_envs < 1:
            raise EnvError(f"GymnaxVectorEnv needs num_envs >= 1, not {num_envs}")
        env, params = _make(env_id, env_kwargs)
        self.env_id, self.gymnax_env, self.env_params = env_id, env, params
        self.num_envs = num_envs
        self.single_observation_space = _gym_space(env.observation_space(params), "observation", env_id,
                                                   channels_first)
        self.single_action_space = _gym_space(env.action_space(params), "action", env_id)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self.render_mode = None
        discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._action_dtype = np.int32 if discrete else np.float32  # gymnax's action dtypes (JAX without x64)
        self._action_shape = (num_envs, *self.single_action_space.shape)
        self._key = jax.random.key(seed)
        self._state: Any = None
        self._jax, self._jnp = jax, jnp

        n = num_envs
        v_reset = jax.vmap(env.reset_env, in_axes=(0, None))
        v_step = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))
        v_truncated = jax.vmap(env.is_truncated, in_axes=(0, None))

        def strong(tree: Any) -> Any:  # one dtype per state leaf whatever made it, so step compiles once
            return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), tree)

        def layout(obs: jax.Array) -> jax.Array:
            obs = obs.astype(jnp.float32)
            return jnp.moveaxis(obs, -1, 1) if channels_first and obs.ndim == 4 else obs

        def reset_keys(keys: jax.Array) -> tuple[jax.Array, Any]:
            obs, state = v_reset(keys, params)
            return layout(obs), strong(state)

        def reset(key: jax.Array) -> tuple[jax.Array, jax.Array, Any]:
            key, sub = jax.random.split(key)
            return key, *reset_keys(jax.random.split(sub, n))

        def step(key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, ...]:
            key, k_step, k_reset = jax.random.split(key, 3)
            obs_st, state_st, reward, terminated, _ = v_step(jax.random.split(k_step, n), state, action, params)
            terminated = terminated.astype(jnp.bool_)
            truncated = jnp.logical_and(v_truncated(state_st, params), ~terminated)
            done = jnp.logical_or(terminated, truncated)
            obs_re, state_re = v_reset(jax.random.split(k_reset, n), params)

            def pick(new: jax.Array, old: jax.Array) -> jax.Array:
                return jnp.where(done.reshape((n,) + (1,) * (jnp.ndim(old) - 1)), new, old)

            final_obs = layout(obs_st)
            state = strong(jax.tree.map(pick, state_re, state_st))
            return (key, state, pick(layout(obs_re), final_obs), final_obs, reward.astype(jnp.float32),
                    terminated, truncated)

        self._reset = jax.jit(reset)
        self._reset_keys = jax.jit(reset_keys)
        self._step = jax.jit(step)

    def reset(self, *, seed: int | Sequence[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env: obs [num_envs, ...] float32 and an empty info dict.

        `seed`: an int restarts the key stream from it (same seed, same first observations and episodes); a
        sequence of num_envs ints seeds env i from `seed[i]` and the stream from `seed[0]`; None draws from the
        stream. `options` are not used (every env is reset).
        """
        jax, jnp = self._jax, self._jnp
        if seed is None:
            self._key, obs, self._state = self._reset(self._key)
        elif isinstance(seed, (int, np.integer)):
            self._key, obs, self._state = self._reset(jax.random.key(int(seed)))
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
            self._key = jax.random.key(seeds[0])
            obs, self._state = self._reset_keys(jax.vmap(jax.random.key)(jnp.asarray(seeds, dtype=jnp.uint32)))
        return to_numpy(obs), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every env: (obs, rewards float32, terminated bool, truncated bool, infos), each [num_envs].

        Ended envs are auto-reset in this step (the class docstring says what `obs` and `infos` then hold).
        """
        if self._state is None:
            raise RuntimeError("GymnaxVectorEnv.step before reset")
        if np.shape(actions) != self._action_shape:
            raise ValueError(f"GymnaxVectorEnv.step takes actions of shape {self._action_shape}, "
                             f"not {np.shape(actions)}")
        action = self._jnp.asarray(np.asarray(actions, dtype=self._action_dtype))  # cast on the host: cheaper
        self._key, self._state, obs, final_obs, reward, terminated, truncated = self._step(self._key, self._state,
                                                                                          action)
        terminated, truncated = to_numpy(terminated), to_numpy(truncated)
        ended = terminated | truncated
        infos: dict[str, Any] = {}
        if ended.any():
            infos = {"final_obs": to_numpy(final_obs), "_final_obs": ended}
        return to_numpy(obs), to_numpy(reward), terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        self._state = None


@functools.lru_cache(maxsize=16)
def _spec_cached(name: str, kwargs_json: str) -> EnvSpec:
    from asyncrl.envs.gym_env import spaces_env_spec
    from asyncrl.envs.names import GYMNAX_PREFIX

    obs, act = gymnax_spaces(name[len(GYMNAX_PREFIX):], channels_first=True, **json.loads(kwargs_json))
    return dataclasses.replace(spaces_env_spec(name, obs, act), batched=True)


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The registry's `gymnax:<id>` row: the spec, described in a fresh process (JAX must not start in a process
    that forks workers); kept per name and arguments."""
    _require_gymnax(name)
    return _spec_cached(name, json.dumps(env_kwargs or {}, sort_keys=True))


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """The registry's `gymnax:<id>` row: one jitted batch of `num_envs` envs."""
    _require_gymnax(name)
    from asyncrl.envs.names import GYMNAX_PREFIX
    from asyncrl.envs.vector_env import VectorVecEnv

    env_id, kwargs = name[len(GYMNAX_PREFIX):], dict(env_kwargs or {})
    return VectorVecEnv(name, lambda n: GymnaxVectorEnv(env_id, n, channels_first=True, **kwargs), num_envs)


def _require_gymnax(name: str) -> None:
    if importlib.util.find_spec("gymnax") is None or importlib.util.find_spec("jax") is None:
        raise EnvError(f"{name!r} needs the gymnax extra (gymnax and jax): {INSTALL_HINT}")
