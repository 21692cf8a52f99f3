"""Envs for the env-hook tests, loaded by name (`hook_envs:<callable>`): env metrics and a curriculum."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_LEN = 10


class RightSteps(gym.Env):
    """Ten steps of choosing left (0) or right (1); each right pays 1. Reports its metrics the two ways asyncrl
    reads: `info["rights"]` at every step (for `--info-keys rights`) and `info["episode_extra_stats"]` at the end.

    A curriculum too: `set_training_info` sets `level` to the run's recent mean return (rounded down), so the
    level follows the learned policy; it is reported as the `level` metric, and `training_infos` counts the calls.
    """

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, text_metric: bool = False) -> None:
        self.text_metric = text_metric  # a bad env: reports a string where --info-keys expects a number
        self.level, self.training_infos = 0, 0
        self.t = self.rights = 0

    def set_training_info(self, info: dict) -> None:
        self.training_infos += 1
        ret = info["episode_return_mean"]
        if ret is not None:
            self.level = int(ret)

    def _obs(self) -> np.ndarray:
        return np.array([self.t / EPISODE_LEN, self.level / EPISODE_LEN], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = self.rights = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.rights += int(action)
        done = self.t >= EPISODE_LEN
        info: dict = {"rights": "many" if self.text_metric else self.rights}
        if done:
            info["episode_extra_stats"] = {"right_share": self.rights / self.t, "level": self.level,
                                           "training_infos": self.training_infos}
        return self._obs(), float(action), done, False, info


def make_right_steps(text_metric: bool = False) -> gym.Env:
    return RightSteps(text_metric)


class MaskedChoice(gym.Env):
    """Each step allows 2 of 4 actions (`action_mask`, 1 = allowed); a forbidden action ends the episode at once
    with -1 and counts a violation. Choosing the highest allowed action pays 1, the other allowed one 0. Episodes
    last 20 steps when nothing forbidden is chosen; `state` repeats the mask, since the mask itself never
    reaches the encoder. `box_action` / `mask_size` make the two kinds of bad mask."""

    LENGTH = 20

    def __init__(self, box_action: bool = False, mask_size: int = 4, multi_binary: bool = False) -> None:
        mask_space = (gym.spaces.MultiBinary(mask_size) if multi_binary
                      else gym.spaces.Box(0, 1, (mask_size,), np.int8))
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(0.0, 1.0, (4,), np.float32),
                                                  "action_mask": mask_space})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32) if box_action else gym.spaces.Discrete(4)
        self.t = 0
        self.mask = np.zeros(4, dtype=np.int8)

    def _obs(self) -> dict:
        self.mask[:] = 0
        self.mask[self.np_random.choice(4, size=2, replace=False)] = 1
        return {"state": self.mask.astype(np.float32), "action_mask": self.mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        action = int(action)
        forbidden = not self.mask[action]
        best = int(np.flatnonzero(self.mask)[-1])
        reward = -1.0 if forbidden else float(action == best)
        done = forbidden or self.t >= self.LENGTH
        info = {"episode_extra_stats": {"violations": float(forbidden)}} if done else {}
        return self._obs(), reward, done, False, info


def make_masked_choice(**kwargs) -> gym.Env:
    return MaskedChoice(**kwargs)


class TupleTarget(gym.Env):
    """One-step episodes with a Tuple action (Discrete(3), Box(-1, 1, (1,))): the observation names a class
    (one-hot) and a value; reward 1 for the right class plus 1 - |box - value|. Reports `hit` (right class) and
    `err` (|box - value|) as env metrics, so each part's learning shows on its own."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (1,), np.float32)))

    def __init__(self) -> None:
        self.target, self.value = 0, 0.0

    def _obs(self) -> np.ndarray:
        self.target = int(self.np_random.integers(3))
        self.value = float(self.np_random.uniform(-0.8, 0.8))
        obs = np.zeros(4, dtype=np.float32)
        obs[self.target], obs[3] = 1.0, self.value
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        choice, box = action
        assert isinstance(choice, int | np.integer) and box.shape == (1,) and -1.0 <= float(box[0]) <= 1.0, action
        hit, err = float(choice == self.target), abs(float(box[0]) - self.value)
        info = {"episode_extra_stats": {"hit": hit, "err": err}}
        return self._obs(), hit + 1.0 - err, True, False, info


def make_tuple_target() -> gym.Env:
    return TupleTarget()


def make_tuple_of_dict() -> gym.Env:
    """A bad env: a Tuple action with a Dict part."""
    env = TupleTarget()
    env.action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Dict({"a": gym.spaces.Discrete(2)})))
    return env
