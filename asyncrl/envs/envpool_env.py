"""EnvPool's C++ batched envs (`envpool:<task id>`: Atari, MuJoCo, DeepMind Control, Procgen, VizDoom, ..., the ids
`envpool.list_all_envs()` lists: 1,626 of EnvPool 1.2.5's 1,651; the multi-player ones and two others are refused
in one line, docs/env-backends.md), the optional `envpool` extra.

One EnvPool per worker split, in its synchronous mode (`batch_size == num_envs`: every step returns all envs, in
env order), stepped through `VectorVecEnv` so its arrays go straight into the slots. EnvPool auto-resets in
gymnasium's NEXT_STEP mode: an ended episode's step returns the observation it reached (kept as the final
observation a truncation bootstraps from) and the env's next step ignores its action and returns the next
episode's first observation with reward 0; `VectorVecEnv` marks that step `skipped`, so it is never trained on
nor counted. EnvPool's asynchronous mode (a batch of whichever envs are ready) is not used: see
docs/env-backends.md for why it does not fit the slot layout, and for its measured speed.

Threads: each pool gets its worker split's share of the usable cores (`split_threads`: the affinity mask and the
cgroup quota, shared among the node's ranks, the rollout workers and their splits), at least 1 and at most its
envs; EnvPool's own thread pinning stays off. Seeds: EnvPool takes its seed when a pool is made, so `reset(seed)`
with a new seed makes the pool again (env i gets seed + i).

Observations: Box observations as EnvPool gives them (Atari's and Procgen's frames are channels first already);
a Dict without images (DeepMind Control, MiniGrid, Jumanji, Playground-in-EnvPool; nested Dicts, Discrete and
MultiBinary entries too) and a Discrete or MultiBinary observation alone are flattened into one float32 vector,
the keys in EnvPool's order (`flat_keys`; a Discrete as its index); a Dict with an image is kept as a Dict.

Processes: importing envpool imports JAX for its XLA interface, and a process that forks asyncrl's workers must
not have imported JAX (`asyncrl.fork_safety`). This module imports envpool with JAX kept out (the XLA interface
is not used) unless JAX was imported already; describing an env reads EnvPool's spec and makes no pool (no
threads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from asyncrl.envs.base import MIN_CNN_FRAME, EnvError, EnvSpec, EpisodeTracker, VecEnv
from asyncrl.envs.dict_obs import ArrayDict
from asyncrl.envs.gym_env import spaces_env_spec
from asyncrl.envs.names import ENVPOOL_PREFIX
from asyncrl.envs.vector_env import VectorVecEnv, autoreset_mode
from asyncrl.system import install_hint, local_world_size, usable_cpus

INSTALL_HINT = install_hint("envpool")
RESERVED = ("num_envs", "batch_size", "num_threads", "seed", "env_seed", "thread_affinity_offset")


def envpool_module() -> Any:
    """The envpool package (imported with JAX kept out unless JAX is imported already), or a one-line EnvError
    saying how to install the extra."""
    if sys.modules.get("envpool") is not None:
        return sys.modules["envpool"]
    blocked = "jax" not in sys.modules
    if blocked:
        sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax` raises ImportError: envpool skips XLA
    try:
        import envpool
    except ImportError as e:
        raise EnvError(f"envpool: envs need the envpool extra ({e}): {INSTALL_HINT}") from None
    finally:
        if blocked:
            del sys.modules["jax"]
    return envpool


def task_id(name: str) -> str:
    """The EnvPool task id of `envpool:<id>`; EnvError (one line, with close matches) for an id EnvPool lacks."""
    task = name[len(ENVPOOL_PREFIX):]
    ids = envpool_module().list_all_envs()
    if task in ids:
        return task
    by_lower = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(task.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = f"; did you mean: {', '.join(ENVPOOL_PREFIX + by_lower[c] for c in close)}?" if close else ""
    raise EnvError(f"unknown EnvPool task {task!r}{hint} (envpool.list_all_envs() has {len(ids)} ids)")


def make_kwargs(name: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """--env-kwargs for `envpool.make` (e.g. {"episodic_life": true}); the pool's own settings are refused."""
    kwargs = dict(env_kwargs or {})
    taken = sorted(set(kwargs) & set(RESERVED))
    if taken:
        raise EnvError(f"--env-kwargs {', '.join(taken)} for {name!r}: asyncrl sets {', '.join(RESERVED)} itself "
                       f"(--envs-per-worker, --worker-splits, --seed); drop them")
    return kwargs


def split_threads(num_envs: int, workers: int, worker_splits: int, cpus: int | None = None,
                  ranks: int | None = None) -> int:
    """EnvPool threads for one worker split: the usable cores shared among this node's ranks, the rollout workers
    and their splits, at least 1 and at most the split's envs."""
    cores = usable_cpus() if cpus is None else cpus
    share = cores // max(1, (local_world_size() if ranks is None else ranks) * workers * worker_splits)
    return max(1, min(num_envs, share))


Leaf = tuple[tuple[str, ...], int]  # (the keys down to one array of a Dict observation, its width flattened)


def flat_keys(space: gym.spaces.Space) -> tuple[Leaf, ...]:
    """The leaves of an observation space that asyncrl takes as one float32 vector, in order: a Dict (nested
    Dicts too) of Boxes, Discretes, MultiDiscretes and MultiBinaries, or one Discrete or MultiBinary alone;
    () for a Box (kept as it is) and for a Dict with an image (kept as a Dict: the CNN reads it)."""
    if isinstance(space, gym.spaces.Box):
        return ()
    leaves: list[Leaf] = []

    def walk(sub: gym.spaces.Space, path: tuple[str, ...]) -> bool:
        if isinstance(sub, gym.spaces.Dict):
            return all(walk(s, (*path, str(k))) for k, s in sub.spaces.items())
        if isinstance(sub, gym.spaces.Box) and len(sub.shape) == 3 and min(sub.shape[:2]) >= MIN_CNN_FRAME:
            return False  # an image
        if isinstance(sub, gym.spaces.Discrete):
            leaves.append((path, 1))
            return True
        if isinstance(sub, gym.spaces.Box | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
            leaves.append((path, int(np.prod(sub.shape, dtype=np.int64))))
            return True
        return False

    return tuple(leaves) if walk(space, ()) else ()


def flat_space(space: gym.spaces.Space) -> gym.spaces.Box:
    """One float32 vector holding every leaf of `space` (`flat_keys`)."""
    width = sum(w for _, w in flat_keys(space))
    return gym.spaces.Box(-np.inf, np.inf, (width,), dtype=np.float32)


def _leaf(obs: Any, path: tuple[str, ...]) -> np.ndarray:
    for key in path:
        obs = obs[key]
    return np.asarray(obs)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """EnvPool's spaces warn (gymnasium lowering their float64 bounds to float32) as they are made: not news."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _spec(name: str, task: str, kwargs: dict[str, Any]) -> EnvSpec:
    envpool = envpool_module()
    try:
        with _quiet():
            made = envpool.make_spec(task, **kwargs)
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        raise EnvError(f"cannot make EnvPool task {task!r} with --env-kwargs {kwargs}: {type(e).__name__}: "
                       f"{(str(e).splitlines() or [''])[0]}") from None
    players = int(getattr(made.config, "max_num_players", 1))
    if players > 1:  # its pools return a row per player, not per env
        raise EnvError(f"EnvPool task {task!r} has {players} players an env; the envpool: backend runs "
                       f"single-player tasks (multi-agent envs: pettingzoo:<family>.<env>, docs/populations.md)")
    obs, act = made.gymnasium_observation_space, made.gymnasium_action_space
    if flat_keys(obs):
        obs = flat_space(obs)
    spec = spaces_env_spec(name, obs, act)
    atari = envpool.registration.registry.specs[task][0] == "envpool.atari"  # frames: agent steps x frame_skip
    frameskip = int(getattr(made.config, "frame_skip", 1)) if atari else 1
    return dataclasses.replace(spec, batched=True, frameskip=max(1, frameskip))


class EnvPoolVecEnv(VectorVecEnv):
    """One synchronous EnvPool of `num_envs` envs of `task`, written into the slots by `VectorVecEnv`."""

    def __init__(self, name: str, task: str, num_envs: int, num_threads: int, kwargs: dict[str, Any]) -> None:
        # VectorVecEnv's state, set here: its constructor would read the spec from the pool's unflattened spaces
        self._task, self._threads, self._kwargs, self._seed = task, num_threads, kwargs, 0
        self.num_envs = num_envs
        self.spec = _spec(name, task, kwargs)
        self.env = self._make(num_envs)
        self.mode = autoreset_mode(self.env)  # NEXT_STEP
        self.skipped = np.zeros(num_envs, dtype=bool)
        self._ended = np.zeros(num_envs, dtype=bool)
        self.episodes = EpisodeTracker(num_envs)
        self._action = self._action_converter(self.env.single_action_space)
        self._flat = flat_keys(self.env.single_observation_space)
        self._keys = tuple(k.key for k in self.spec.obs_keys)
        self._chw_keys = frozenset(k.key for k in self.spec.obs_keys if k.channels_last)

    def _make(self, num_envs: int) -> gym.vector.VectorEnv:
        with _quiet():
            return envpool_module().make_gymnasium(self._task, num_envs=num_envs, batch_size=num_envs,
                                                   num_threads=self._threads, seed=self._seed % 2**31,
                                                   **self._kwargs)

    def reset(self, seed: int, obs_out: np.ndarray | ArrayDict) -> None:
        if seed != self._seed:  # EnvPool seeds a pool when it is made
            self.env.close()
            self._seed = seed
            self.env = self._make(self.num_envs)
        obs, _ = self.env.reset()
        self._write(obs_out, obs)
        self.episodes.drop()
        self._ended[:] = False
        self.skipped[:] = False

    def _write(self, out: np.ndarray | ArrayDict, obs: Any) -> None:
        if not self._flat:
            return super()._write(out, obs)
        at = 0
        for path, width in self._flat:
            out[:, at:at + width] = _leaf(obs, path).reshape(self.num_envs, width)
            at += width
        return None

    def _write_rows(self, out: np.ndarray | ArrayDict, rows: np.ndarray, obs: Any, what: str) -> None:
        if not self._flat:
            return super()._write_rows(out, rows, obs, what)
        at = 0
        for path, width in self._flat:
            out[rows, at:at + width] = _leaf(obs, path)[rows].reshape(len(rows), width)
            at += width
        return None


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None, **_: Any) -> EnvSpec:
    """The registry's `envpool:<id>` row: the spec, from EnvPool's own (no pool made)."""
    return _spec(name, task_id(name), make_kwargs(name, env_kwargs))


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None, workers: int = 1, worker_splits: int = 1) -> VecEnv:
    """The registry's `envpool:<id>` row: one synchronous pool of `num_envs` envs with its split's threads."""
    task, kwargs = task_id(name), make_kwargs(name, env_kwargs)
    return EnvPoolVecEnv(name, task, num_envs, split_threads(num_envs, workers, worker_splits), kwargs)
