"""The registry's gymnasium and mujoco rows: a registered gymnasium id or a `module:callable` made as the user
wrote it, and adapted by what it returns: a `gymnasium.Env` (stepped one at a time, `GymVecEnv`), a VectorEnv
(one batch, `VectorVecEnv`) or a multi-agent env (its agents as env columns, `asyncrl.envs.multi_agent`)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from asyncrl.envs.base import EnvError, EnvSpec, VecEnv, close_env, first_line
from asyncrl.envs.gym_env import GymVecEnv, gym_env_spec
from asyncrl.envs.names import is_ale, is_mujoco, unknown_env, use_atari
from asyncrl.system import install_hint
from asyncrl.user_code import cwd_on_path


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None, env_vectorization: str = "auto") -> EnvSpec:
    """The registry's gymnasium and mujoco rows: the spec of a registered id or of what a module:callable returns
    (a gymnasium.Env, a VectorEnv or a multi-agent env), made once and closed."""
    make = gym_maker(name, None, env_kwargs, env_vectorization)
    made = make(1)
    from asyncrl.envs.multi_agent import is_multi_agent, multi_agent_spec

    if is_multi_agent(made):
        try:
            return multi_agent_spec(name, made)
        finally:
            close_env(made)
    if isinstance(made, gym.vector.VectorEnv):
        from asyncrl.envs.vector_env import vector_env_spec

        try:
            spec = vector_env_spec(name, made)
            return spec if getattr(make, "sized", True) else dataclasses.replace(spec, fixed_num_envs=made.num_envs)
        finally:
            made.close()
    env = _check_env(name, made)
    try:
        return gym_env_spec(name, env)
    finally:
        env.close()


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None, env_vectorization: str = "auto") -> VecEnv:
    """The registry's gymnasium and mujoco rows: `num_envs` envs, as one batch where the name gives a VectorEnv,
    as env columns of a multi-agent env, or else stepped one after another (`GymVecEnv`)."""
    make = gym_maker(name, render_mode, env_kwargs, env_vectorization)
    made = make(num_envs)
    if isinstance(made, gym.vector.VectorEnv):
        from asyncrl.envs.vector_env import VectorVecEnv

        return VectorVecEnv(name, lambda n: made, num_envs)
    from asyncrl.envs.multi_agent import is_multi_agent, multi_agent_vec

    if is_multi_agent(made):
        return multi_agent_vec(name, made, lambda: make(1), num_envs)
    first = [_check_env(name, made)]  # the first env is the one just made; the others are made as it was

    def factory() -> gym.Env:
        return first.pop() if first else _check_env(name, make(1))

    return GymVecEnv(name, factory, num_envs)


def _check_env(name: str, made: object) -> gym.Env:
    if not isinstance(made, gym.Env):
        from asyncrl.envs.vector_env import check_vector_env

        check_vector_env(name, made, 1)  # raises: neither an Env nor a VectorEnv
    return made  # type: ignore[return-value]


def gym_maker(name: str, render_mode: str | None = None, env_kwargs: dict[str, Any] | None = None,
              vectorization: str = "auto") -> Callable[[int], object]:
    """make(n): env `name` as a gymnasium VectorEnv of n envs where it is batched (an id's vectorised
    implementation under --env-vectorization auto, when nothing is rendered; a module:callable returning one),
    otherwise one gymnasium.Env (n ignored)."""
    spec = gym.registry.get(name)
    if spec is not None:
        if is_ale(spec):
            raise use_atari(name, spec)
        if vectorization == "auto" and spec.vector_entry_point is not None and render_mode is None:
            return lambda n: _make_gym_vec(name, n, env_kwargs)
        return lambda n: _make_gym(name, render_mode, env_kwargs)
    if ":" in name:
        return _custom_maker(name, render_mode, env_kwargs, vectorization)
    raise unknown_env(name)


def _make_gym_vec(name: str, num_envs: int, env_kwargs: dict[str, Any] | None = None) -> gym.vector.VectorEnv:
    try:
        return gym.make_vec(name, num_envs=num_envs, vectorization_mode="vector_entry_point", **(env_kwargs or {}))
    except (gym.error.Error, TypeError) as e:
        raise EnvError(f"cannot make gymnasium vector env {name!r}: {first_line(e)}; --env-vectorization loop "
                       f"steps its envs one at a time") from e


def _make_gym(name: str, render_mode: str | None = None, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    try:
        return gym.make(name, **(env_kwargs or {}), **({"render_mode": render_mode} if render_mode else {}))
    except (gym.error.Error, TypeError) as e:  # TypeError: a constructor argument it does not take
        hint = f" ({install_hint('mujoco')})" if is_mujoco(name) and "mujoco" in str(e).lower() else ""
        raise EnvError(f"cannot make gymnasium env {name!r}: {first_line(e)}{hint}") from e


def _custom_maker(name: str, render_mode: str | None = None, env_kwargs: dict[str, Any] | None = None,
                  vectorization: str = "auto") -> Callable[[int], object]:
    """make(n) for `module:callable`: the callable's result (called with num_envs=n where it takes that argument)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise EnvError(f"custom env {name!r} must be given as module:callable")
    cwd_on_path()  # a my_env.py beside the user, as `python -c` finds it
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EnvError(f"cannot import module {module_name!r} for env {name!r}: {e}") from e
    if attr in gym.registry:  # gymnasium's own `module:EnvId` form (the import registered the id)
        return gym_maker(attr, render_mode, env_kwargs, vectorization)
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EnvError(f"module {module_name!r} has no attribute {attr!r} (env {name!r})") from None
    if not callable(obj):
        raise EnvError(f"{name!r} is not callable; it should return a gymnasium.Env or a gymnasium.vector.VectorEnv")
    call: Callable[..., object] = obj
    kwargs = dict(env_kwargs or {})
    sized = _takes_num_envs(call) and "num_envs" not in kwargs

    def make(num_envs: int) -> object:
        try:
            return call(**kwargs, **({"num_envs": num_envs} if sized else {}))
        except TypeError as e:
            if not kwargs:
                raise
            raise EnvError(f"{name!r} does not take --env-kwargs {kwargs}: {first_line(e)}") from e

    make.sized = sized  # type: ignore[attr-defined]  # False: a VectorEnv it returns has a size of its own
    return make


def _takes_num_envs(call: Callable[..., object]) -> bool:
    try:
        return "num_envs" in inspect.signature(call).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
