"""Atari via ale_py's C++ vector env, with v4-style preprocessing done in C++.

Life loss is detected here from `info["lives"]` rather than with ale_py's flags: `episodic_life=True` resets
the whole game on a life loss (so no episode ever spans more than one life), and `life_loss_info=True` sets
`terminated` on a life loss too, which makes a life loss indistinguishable from game over. With both off,
`terminated | truncated` is exactly game over and a drop in `lives` is exactly a life loss.

A game is cut after `max_episode_frames` emulator frames (ale_py's `max_num_frames_per_episode`); that cut is
reported as a truncation, with ale_py's `info["final_obs"]` (the frame stack the game reached) as the final
observation, so the learner bootstraps from it instead of treating the cut as a game over.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv

from asyncrl.envs.base import EnvSpec, EpisodeStats, EpisodeTracker, VecEnv
from asyncrl.envs.names import ATARI_PREFIX, rom_ids, unknown_env

FRAMESKIP = 4
STACK = 4
SIZE = 84
MAX_EPISODE_FRAMES = 108_000  # 30 minutes of play at 60 Hz, the usual Atari evaluation cap


class AtariVecEnv(VecEnv):
    """`num_envs` games of one ROM, stepped by `num_threads` C++ threads.

    Training mode: terminated on life loss (the game continues) and rewards clipped to their sign.
    Eval mode: terminated only at game over, raw rewards. Both: truncated when the game reaches
    `max_episode_frames` emulator frames. Episode stats are always whole games with raw scores.
    """

    def __init__(self, game: str, num_envs: int, training: bool = True, num_threads: int = 1,
                 max_episode_frames: int = MAX_EPISODE_FRAMES) -> None:
        self.num_envs = num_envs
        self.training = training
        self._env: AtariVectorEnv | None = AtariVectorEnv(
            game,
            num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=max_episode_frames,
            repeat_action_probability=0.0,
            noop_max=30,
            frameskip=FRAMESKIP,
            maxpool=True,
            use_fire_reset=True,
            img_height=SIZE,
            img_width=SIZE,
            grayscale=True,
            stack_num=STACK,
            episodic_life=False,
            life_loss_info=False,
            reward_clipping=False,
            autoreset_mode="SameStep",
        )
        self.spec = EnvSpec(
            name=f"atari_{game}",
            obs_shape=(STACK, SIZE, SIZE),
            obs_dtype=np.dtype(np.uint8),
            action_space=gym.spaces.Discrete(int(self._env.single_action_space.n)),  # minimal action set
            frameskip=FRAMESKIP,
        )
        self._lives = np.zeros(num_envs, dtype=np.int32)
        self.episodes = EpisodeTracker(num_envs)

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        seeds = (int(seed) + np.arange(self.num_envs, dtype=np.int64)) % 2**31  # ALE seeds are C ints
        obs, info = self._live().reset(seed=seeds)
        obs_out[:] = obs
        self._lives[:] = info["lives"]
        self.episodes.drop()

    def step(
        self, actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, terminated_out: np.ndarray,
        truncated_out: np.ndarray, final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        obs, reward, terminated, truncated, info = self._live().step(np.asarray(actions, dtype=np.int64))
        obs_out[:] = obs
        self.episodes.add(reward)
        game_over = terminated | truncated
        lives = info["lives"]  # after a game over (same-step reset) this is the new game's count
        if self.training:
            reward_out[:] = np.sign(reward)
            terminated_out[:] = terminated | (lives < self._lives)
        else:
            reward_out[:] = reward
            terminated_out[:] = terminated
        cut = truncated & ~terminated_out
        truncated_out[:] = cut
        self._lives[:] = lives

        if not game_over.any():
            return []
        if cut.any():
            final_obs_out[cut] = info["final_obs"][cut]
        ended = np.flatnonzero(game_over)
        return self.episodes.end_many(ended, (truncated & ~terminated)[ended])  # whole games: life losses aside

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None  # dropping the C++ env is what stops its threads

    def _live(self) -> AtariVectorEnv:
        if self._env is None:
            raise RuntimeError(f"{self.spec.name} env used after close()")
        return self._env


def backend_spec(name: str) -> EnvSpec:
    """The registry's `atari_<game>` row: the spec (of a one-game env, closed again)."""
    env = backend_vec(name, 1, True, None)
    try:
        return env.spec
    finally:
        env.close()


def backend_vec(name: str, num_envs: int, training: bool, render_mode: str | None, env_threads: int = 1,
                max_episode_frames: int | None = None) -> VecEnv:
    """The registry's `atari_<game>` row: `num_envs` games; EnvError (with close matches) for an unknown ROM."""
    game = name[len(ATARI_PREFIX):]
    if game not in rom_ids():
        raise unknown_env(name)
    return AtariVecEnv(game, num_envs, training=training, num_threads=env_threads,
                       max_episode_frames=max_episode_frames or MAX_EPISODE_FRAMES)
