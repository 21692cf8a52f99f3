"""Multi-agent envs: every agent is one env column of the slots, the agents of one env instance side by side.

Agent k of instance i is column `i * num_agents + k`; the policy acts for each column as for a single-agent env,
and every agent's rewards, returns and episode lengths are its own. Two multi-agent APIs are recognised by what
the made object has:

- PettingZoo's `ParallelEnv` (it has `possible_agents`): dicts keyed by the agents still in the episode. An agent
  whose episode ends while the others play on is masked: its rows are written to `skipped` (not trained on, not
  counted as agent steps) until the instance's episode ends (`env.agents` is empty); then the instance is reset
  and all its agents start the next episode in the same step.
- Sample Factory's (`is_multiagent` and `num_agents`): lists indexed by agent, every agent stepping every step,
  and the env resetting itself (the observation returned at an agent's episode end is its next episode's first;
  a truncated agent bootstraps from `info["final_obs"]`, the observation it reached, or where the env does not
  give it, from the observation it acted on last).

The agents of an env must share one observation and one action space (pad them to one otherwise, e.g. with
SuperSuit's `pad_observations_v0` and `pad_action_space_v0`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncrl.envs.base import (
    EnvError,
    EnvSpec,
    EpisodeStats,
    EpisodeTracker,
    VecEnv,
    close_env,
    episode_extras,
    first_line,
)
from asyncrl.envs.gym_env import EnvActions, spaces_env_spec
from asyncrl.envs.names import PETTINGZOO_PREFIX
from asyncrl.system import install_hint


def is_multi_agent(env: object) -> bool:
    """A PettingZoo ParallelEnv (`possible_agents`) or a Sample Factory multi-agent env (`is_multiagent`)."""
    return _is_parallel(env) or bool(getattr(env, "is_multiagent", False))


def _is_parallel(env: object) -> bool:
    return hasattr(env, "possible_agents")


def _agent_ids(env: object) -> list[Any]:
    return list(env.possible_agents) if _is_parallel(env) else list(range(int(env.num_agents)))


def multi_agent_spec(name: str, env: object) -> EnvSpec:
    """The spec of one agent of `env` (all of them alike; else EnvError), with `num_agents` set."""
    agents = _agent_ids(env)
    if not agents:
        raise EnvError(f"env {name!r} is a multi-agent env without agents")
    if _is_parallel(env):
        spaces = [(env.observation_space(a), env.action_space(a)) for a in agents]
    else:
        spaces = [(env.observation_space, env.action_space)]
    for agent, (obs_space, act_space) in zip(agents, spaces):
        if (obs_space, act_space) != spaces[0]:
            raise EnvError(f"env {name!r} has agents of different spaces ({agents[0]!r}: "
                           f"{_brief(spaces[0])}; {agent!r}: {_brief((obs_space, act_space))}); asyncrl trains "
                           f"agents of one observation and action space: pad them to one (SuperSuit's "
                           f"pad_observations_v0 and pad_action_space_v0)")
    return dataclasses.replace(spaces_env_spec(name, *spaces[0]), num_agents=len(agents))


def _brief(spaces: tuple[Any, Any]) -> str:
    return " / ".join(" ".join(str(s).split()) for s in spaces)


def check_self_play(name: str, spec: EnvSpec, self_play: bool) -> None:
    """EnvError (one line) for --self-play on an env without opponents (a single-agent env)."""
    if self_play and spec.num_agents < 2:
        raise EnvError(f"--self-play seats a learning policy against snapshots in a multi-agent env, but {name!r} has "
                       f"one agent; drop --self-play")


def check_agent_columns(name: str, spec: EnvSpec, columns: int) -> None:
    """EnvError (one line) when `columns` env columns (a worker split's) are not whole env instances."""
    if spec.num_agents > 1 and columns % spec.num_agents:
        raise EnvError(f"env {name!r} has {spec.num_agents} agents, each an env column, so a worker split's env "
                       f"count ({columns}) must be a multiple of {spec.num_agents}: set --envs-per-worker to a "
                       f"multiple of {spec.num_agents} x --worker-splits")


class MultiAgentVecEnv(VecEnv):
    """`ceil(num_envs / num_agents)` multi-agent env instances made by `factory`, one column per agent."""

    def __init__(self, name: str, factory: Callable[[], object], num_envs: int) -> None:
        first = factory()
        try:
            self.spec = multi_agent_spec(name, first)
        except EnvError:
            close_env(first)
            raise
        self.agents = _agent_ids(first)
        per = self.num_agents = len(self.agents)
        self.instances = [first] + [factory() for _ in range(math.ceil(num_envs / per) - 1)]
        self.num_envs = len(self.instances) * per
        self.parallel = _is_parallel(first)
        self.skipped = np.zeros(self.num_envs, dtype=bool)
        self._done = np.zeros(self.num_envs, dtype=bool)  # PettingZoo: the agent's episode ended, the env's not
        self.episodes = EpisodeTracker(self.num_envs)
        self._actions = EnvActions(self.spec)
        self._chw_keys = tuple(k.key for k in self.spec.obs_keys if k.channels_last)
        self._last: list[Any] = [None] * self.num_envs  # each agent's latest observation (a masked row repeats it)

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        for i, env in enumerate(self.instances):
            self._write_reset(i, env.reset(seed=seed + i), obs_out)
        self._done[:] = False
        self.episodes.drop()

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        self.skipped[:] = False
        acts = self._actions(actions)
        stats: list[EpisodeStats] = []
        for i, env in enumerate(self.instances):
            if self.parallel:
                self._step_parallel(i, env, acts, obs_out, reward_out, terminated_out, truncated_out, final_obs_out,
                                    stats)
            else:
                self._step_lists(i, env, acts, obs_out, reward_out, terminated_out, truncated_out, final_obs_out,
                                 stats)
        return stats

    def _step_parallel(self, i: int, env: Any, acts: list, obs_out: np.ndarray, reward_out: np.ndarray,
                       terminated_out: np.ndarray, truncated_out: np.ndarray, final_obs_out: np.ndarray,
                       stats: list[EpisodeStats]) -> None:
        base = i * self.num_agents
        live = set(env.agents)
        acting = [k for k, a in enumerate(self.agents) if a in live and not self._done[base + k]]
        obs, rewards, terms, truncs, infos = env.step({self.agents[k]: acts[base + k] for k in acting})
        ended = not env.agents
        acted = set(acting)
        for k, agent in enumerate(self.agents):
            c = base + k
            reward_out[c] = 0.0
            terminated_out[c] = truncated_out[c] = False
            if k not in acted:  # out of this episode already: a masked row
                self.skipped[c] = True
                obs_out[c] = self._last[c]
                continue
            if agent in obs:
                self._last[c] = self._chw(obs[agent])
            term, trunc = bool(terms.get(agent, False)), bool(truncs.get(agent, False))
            trunc = trunc or (ended and not term)  # the env's episode ended without a word on this agent: a cut
            self._record(c, float(rewards.get(agent, 0.0)), term, trunc, infos.get(agent) or {}, reward_out,
                         terminated_out, truncated_out, final_obs_out, stats)
            obs_out[c] = self._last[c]
        if ended:
            self._write_reset(i, env.reset(), obs_out)
            self._done[base:base + self.num_agents] = False

    def _step_lists(self, i: int, env: Any, acts: list, obs_out: np.ndarray, reward_out: np.ndarray,
                    terminated_out: np.ndarray, truncated_out: np.ndarray, final_obs_out: np.ndarray,
                    stats: list[EpisodeStats]) -> None:
        base = i * self.num_agents
        obs, rewards, terms, truncs, infos = env.step(acts[base:base + self.num_agents])
        for k in range(self.num_agents):
            c = base + k
            term, trunc, info = bool(terms[k]), bool(truncs[k]), (infos[k] if infos else None) or {}
            if trunc and not term and "final_obs" in info:
                self._last[c] = self._chw(info["final_obs"])
            self._record(c, float(rewards[k]), term, trunc, info, reward_out, terminated_out, truncated_out,
                         final_obs_out, stats)
            self._last[c] = obs_out[c] = self._chw(obs[k])
            self._done[c] = False

    def _record(self, c: int, reward: float, term: bool, trunc: bool, info: dict, reward_out: np.ndarray,
                terminated_out: np.ndarray, truncated_out: np.ndarray, final_obs_out: np.ndarray,
                stats: list[EpisodeStats]) -> None:
        """Column c's reward and episode-end flags; its episode's stats when it ended (`_last[c]` is the observation
        it reached, the final one of a truncation)."""
        reward_out[c] = reward
        self.episodes.add(reward, c)
        cut = trunc and not term
        terminated_out[c], truncated_out[c] = term, cut
        if term or trunc:
            stats.append(self.episodes.end(c, cut, episode_extras(info, self.info_keys)))
            self._done[c] = True
            if cut:
                final_obs_out[c] = self._last[c]

    def _write_reset(self, i: int, reset: Any, obs_out: np.ndarray) -> None:
        """Write instance i's first observations (an (obs, infos) pair, or the observations alone)."""
        obs = reset[0] if isinstance(reset, tuple) and len(reset) == 2 else reset
        for k, agent in enumerate(self.agents):
            c = i * self.num_agents + k
            if self.parallel and agent not in obs:
                raise EnvError(f"env {self.spec.name!r} left agent {agent!r} out of its reset observations; asyncrl "
                               f"needs every one of possible_agents at an episode's start")
            self._last[c] = obs_out[c] = self._chw(obs[agent] if self.parallel else obs[k])

    def _chw(self, obs: Any) -> Any:
        """A channels-last image as (C, H, W) (Dict keys likewise); else as is."""
        if self.spec.channels_last:
            return np.moveaxis(np.asarray(obs), 2, 0)
        if self._chw_keys:
            return {k: np.moveaxis(v, 2, 0) if k in self._chw_keys else v for k, v in obs.items()}
        return obs

    def close(self) -> None:
        for env in self.instances:
            close_env(env)


def multi_agent_vec(name: str, made: object, make_one: Callable[[], object], num_envs: int) -> MultiAgentVecEnv:
    """A MultiAgentVecEnv whose first instance is `made`, the others made by `make_one`."""
    first = [made]
    return MultiAgentVecEnv(name, lambda: first.pop() if first else make_one(), num_envs)


def _pettingzoo_maker(name: str, env_kwargs: dict[str, Any] | None = None) -> Callable[[], object]:
    """make(): `pettingzoo:<family>.<env>` as that PettingZoo module's parallel_env(**env_kwargs)."""
    path = name[len(PETTINGZOO_PREFIX):]
    if importlib.util.find_spec("pettingzoo") is None:
        raise EnvError(f"{name!r} needs the multiagent extra (pettingzoo): {install_hint('multiagent')}")
    try:
        module = importlib.import_module(f"pettingzoo.{path}")
    except ImportError as e:
        raise EnvError(f"cannot import pettingzoo.{path} for env {name!r}: {first_line(e)} (names are "
                       f"pettingzoo:<family>.<env>, e.g. pettingzoo:butterfly.knights_archers_zombies_v11)") from None
    if not hasattr(module, "parallel_env"):
        raise EnvError(f"pettingzoo.{path} has no parallel_env (turn-based AEC envs are not supported); asyncrl "
                       f"steps PettingZoo's ParallelEnv API")
    kwargs = dict(env_kwargs or {})

    def make() -> object:
        try:
            return module.parallel_env(**kwargs)
        except Exception as e:  # noqa: BLE001 - the env's own complaint about its arguments, as one line
            raise EnvError(f"cannot make {name!r} with --env-kwargs {kwargs}: {first_line(e)}") from None

    return make


def backend_spec(name: str, env_kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The registry's `pettingzoo:<family>.<env>` row: the spec of one agent (one env made, and closed)."""
    env = _pettingzoo_maker(name, env_kwargs)()
    try:
        return multi_agent_spec(name, env)
    finally:
        close_env(env)


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None,
                env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """The registry's `pettingzoo:<family>.<env>` row: `num_envs` env columns, one per agent."""
    return MultiAgentVecEnv(name, _pettingzoo_maker(name, env_kwargs), num_envs)
