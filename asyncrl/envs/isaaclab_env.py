"""Isaac Lab's vector envs (`isaaclab:<task>`, e.g. `isaaclab:Isaac-Cartpole-Direct-v0`), and any env with their
interface (`isaaclab:<module>:<callable>`).

The interface, shared by Isaac Lab's `DirectRLEnv` and `ManagerBasedRLEnv`: `num_envs`, `device`,
`single_observation_space` (a Dict whose "policy" entry is what the policy sees), `single_action_space`;
`reset(seed=...)` returns (obs, extras) and `step(actions)` returns (obs, reward, terminated, truncated, extras),
every value a torch tensor of `num_envs` rows on `device`, `obs` a dict of them ("policy", and "critic" where the
task has one). The env resets ended envs itself in the same step, and reports no final observation.

`IsaacLabVecEnv` keeps the env, its state and its observations on the device: a step sends the actions there as
one tensor, and the step's policy observations, rewards and flags come back in one batched copy each into the
worker's slot (asyncrl's slots are host shared memory read by other processes, so that copy is where the batch
leaves the device). Truncation: Isaac Lab has already reset an env whose time ran out, so the observation it
reached is gone; the slot's final observation is the one before that step (kept on the device), whose value
bootstraps the cut, as rl_games' and RSL-RL's Isaac Lab runners do with the value of the step's start state.

Isaac Sim must be started (`AppLauncher`) before Isaac Lab's tasks are imported, and once per process: run
`--workers 1 --worker-splits 1` with many envs (`--envs-per-worker 4096`), the one worker owning the GPU's sim.
The spec is read in a fresh process that starts Isaac Sim headless, so the parent never loads CUDA before it
forks. `--env-kwargs {"device": "cuda:1"}` picks the sim's device (default `cuda:0`). `scripts/gpu_check.sh`
runs Isaac-Cartpole-Direct-v0 where Isaac Lab is installed. The `<module>:<callable>` form calls
`callable(num_envs=n, **env_kwargs)` for an env of this interface (a torch vector env of one's own, as
tests/isaac_envs.py), made in the calling process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from typing import Any

import gymnasium as gym
import numpy as np

from asyncrl.envs.base import EnvError, EnvSpec, EpisodeStats, EpisodeTracker, VecEnv, first_line
from asyncrl.envs.fresh_process import described_in_child
from asyncrl.envs.gym_env import spaces_env_spec
from asyncrl.envs.names import ISAACLAB_PREFIX
from asyncrl.user_code import cwd_on_path

DEFAULT_DEVICE = "cuda:0"
INSTALL = "install Isaac Sim and Isaac Lab (https://isaac-sim.github.io/IsaacLab: pip install isaaclab[isaacsim])"


def make_isaaclab(task: str, num_envs: int, device: str = DEFAULT_DEVICE, **cfg: Any) -> Any:
    """Isaac Lab task `task` with `num_envs` envs on `device` (Isaac Sim started headless first, as it must be);
    `cfg` sets fields of the task's env config. The unwrapped env (its vector interface)."""
    try:
        from isaaclab.app import AppLauncher
    except ImportError as e:
        raise EnvError(f"isaaclab:{task} needs Isaac Lab ({e}): {INSTALL}") from None
    AppLauncher(headless=True, device=device)
    import isaaclab_tasks  # noqa: F401  # registers the Isaac-* gymnasium ids
    from isaaclab_tasks.utils import parse_env_cfg

    if task not in gym.registry:
        raise EnvError(f"unknown Isaac Lab task {task!r}; its tasks are the Isaac-* gymnasium ids")
    env_cfg = parse_env_cfg(task, device=device, num_envs=num_envs)
    for key, value in cfg.items():
        setattr(env_cfg, key, value)
    return gym.make(task, cfg=env_cfg).unwrapped


def _maker(name: str, env_kwargs: dict[str, Any]) -> Any:
    """make(n): the env of `name` with n envs."""
    target = name[len(ISAACLAB_PREFIX):]
    if ":" not in target:
        return lambda n: make_isaaclab(target, n, **env_kwargs)
    module_name, _, attr = target.partition(":")
    cwd_on_path()
    try:
        call = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise EnvError(f"cannot find {target!r} for env {name!r}: {first_line(e)}") from None
    return lambda n: call(num_envs=n, **env_kwargs)


def isaaclab_spec(name: str, env: Any) -> EnvSpec:
    """The spec of the env's "policy" observations and its actions, marked batched."""
    obs_space = env.single_observation_space
    if not isinstance(obs_space, gym.spaces.Dict) or "policy" not in obs_space.spaces:
        raise EnvError(f"env {name!r} has no 'policy' entry in its observation space ({obs_space}); Isaac Lab envs "
                       f"give the policy's observations under obs['policy']")
    return dataclasses.replace(spaces_env_spec(name, obs_space["policy"], env.single_action_space), batched=True)


_SPEC_CHILD = """\
import pickle, sys
out, sys.stdout = sys.stdout.buffer, sys.stderr
from asyncrl.envs.base import EnvError
from asyncrl.envs.isaaclab_env import _maker, isaaclab_spec
name, kwargs = pickle.load(sys.stdin.buffer)
try:
    env = _maker(name, kwargs)(1)
    result = ("ok", isaaclab_spec(name, env))
    env.close()
except EnvError as e:
    result = ("error", str(e))
out.write(pickle.dumps(result))
out.flush()
"""


def _described(name: str, env_kwargs: dict[str, Any]) -> EnvSpec:
    """An Isaac Lab task's spec, read in a fresh process (Isaac Sim and CUDA stay out of this one)."""
    return described_in_child(_SPEC_CHILD, (name, env_kwargs), repr(name), 900,
                              doing="starting Isaac Sim to read its spaces")


class IsaacLabVecEnv(VecEnv):
    """An Isaac Lab-style torch vector env of `num_envs` envs, its policy observations written into the slots."""

    def __init__(self, name: str, env: Any, num_envs: int) -> None:
        import torch

        if int(env.num_envs) != num_envs:
            raise EnvError(f"{name!r} made {env.num_envs} envs where {num_envs} were asked for")
        self.env, self.num_envs, self.device = env, num_envs, torch.device(env.device)
        self.spec = isaaclab_spec(name, env)
        self.episodes = EpisodeTracker(num_envs)
        self._torch = torch
        self._prev: Any = None  # the last policy observations, on the device: a truncation's final observation
        space = env.single_action_space
        bounded = isinstance(space, gym.spaces.Box) and np.isfinite(space.low).all() and np.isfinite(space.high).all()
        self._low, self._high = ((torch.as_tensor(space.low, device=self.device),
                                  torch.as_tensor(space.high, device=self.device)) if bounded else (None, None))

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        obs, _ = self.env.reset(seed=int(seed))
        self._prev = obs["policy"].clone()
        self._host(obs_out)[...] = self._prev
        self.episodes.drop()

    def step(self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
             truncated_out: np.ndarray, final_obs_out: np.ndarray) -> list[EpisodeStats]:
        torch = self._torch
        act = torch.as_tensor(actions, device=self.device)
        if self.spec.discrete:
            act = act.long()
        elif self._low is not None:
            act = torch.clamp(act.float(), self._low, self._high)
        obs, reward, terminated, truncated, _ = self.env.step(act)
        terminated = terminated.bool()
        cut = truncated.bool() & ~terminated
        self._host(reward_out)[...] = reward
        self._host(terminated_out)[...] = terminated
        self._host(truncated_out)[...] = cut
        policy = obs["policy"]
        self._host(obs_out)[...] = policy
        self.episodes.add(reward_out)
        rows = np.flatnonzero(terminated_out | truncated_out)
        if len(rows):
            cut_rows = np.flatnonzero(truncated_out)
            if len(cut_rows):
                final_obs_out[cut_rows] = self._prev[torch.as_tensor(cut_rows, device=self.device)].cpu().numpy()
        self._prev.copy_(policy)
        return self.episodes.end_many(rows, truncated_out[rows]) if len(rows) else []

    def close(self) -> None:
        self.env.close()

    def _host(self, array: np.ndarray) -> Any:
        """A torch view of a slot array (host memory): a device tensor copied into it crosses once."""
        return self._torch.from_numpy(array)


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The registry's `isaaclab:` row: an Isaac Lab task's spec read in a fresh process, or a `module:callable`'s
    from one env made here."""
    kwargs = dict(env_kwargs or {})
    if ":" in name[len(ISAACLAB_PREFIX):]:
        env = _maker(name, kwargs)(1)
        try:
            return isaaclab_spec(name, env)
        finally:
            env.close()
    return _spec_cached(name, json.dumps(kwargs, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _spec_cached(name: str, kwargs_json: str) -> EnvSpec:
    return _described(name, json.loads(kwargs_json))


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """The registry's `isaaclab:` row: one vector env of `num_envs` envs on its device."""
    return IsaacLabVecEnv(name, _maker(name, dict(env_kwargs or {}))(num_envs), num_envs)
