"""The rollout stage: one rollout worker's env splits stepped into trajectory slots, knowing nothing of processes.

For each split it holds one slot at a time (`slots[split]`, at row `steps[split]`) and writes what the envs give:
the next observation, rewards, terminated/truncated, `valid` (a step the learner may train on) and `first` (an
episode starts at this row: after an episode end, at a reset, where the backend replaced an env instance), and the
final observation of a truncated env (`final_obs`/`final_step`). The actions it steps with and the actor's state
are the inference stage's, written into the same slots. When a slot is full, `hand_over` copies out the row
that starts the next trajectory (the bootstrap observation, its `first` flags and the actor's state) and
`take_over` writes it into the split's next slot: whoever moves slot indices (a process and its queues, or the
serial loop) decides where the full slot goes and where the next one comes from.

Env faults are triaged here and reported through `EnvEvents`: an instance the backend replaced (its step left out
of training, its fresh observation starts an episode), a backend that raised for the whole split (the step lost,
the split reset into the next row), and `StageFatal` for what no retry can fix (envs that cannot be made, a fresh
instance that fails before its first step, a metric that is not a number).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvBroken, EnvError, EnvFault, EnvInfoError, EpisodeStats, VecEnv
from asyncrl.envs.dict_obs import zeros_like
from asyncrl.envs.registry import make_vec_env
from asyncrl.runtime.plumbing.trajectories import NO_FINAL, obs_arrays, state_arrays
from asyncrl.shm import SharedArrays


class StageFatal(Exception):
    """The run cannot go on: a one-line message and the run's exit code (2: bad input)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class EnvEvents(Protocol):
    """Where a rollout stage's env faults go: the transport counts and reports them."""

    def env_error(self, message: str, where: str, count: int, split: int, action: str) -> None: ...


class Stepped(NamedTuple):
    """One split's step: agent steps taken (a NEXT_STEP backend's own resets and a lost step are not), env errors,
    the episodes that ended, and whether the slot is now full."""

    agent_steps: int
    env_errors: int
    finished: list[EpisodeStats]
    full: bool


def episode_report(e: EpisodeStats) -> tuple:
    """A finished episode as the stage reports it: (return, length, truncated[, extra stats])."""
    return (e.ret, e.length, e.truncated) if e.extra is None else (e.ret, e.length, e.truncated, e.extra)


def split_seed(cfg: Config, split: int, generation: int = 0, errors: int = 0) -> int:
    """The reset seed of the run's split `split` (worker x --worker-splits + its split): the original seeds on a
    first start, different ones after a worker's restarts (`generation`) and its env errors."""
    base = cfg.seed * 1_000_003 + split * cfg.envs_per_split
    return base + 7_919 * (generation * 1_000_003 + errors)


def skip_reset_rows(skipped: np.ndarray, valid: np.ndarray, first: np.ndarray) -> int:
    """Leave the rows of a reset step out of training and start their episodes at the next observation; how many."""
    np.logical_and(valid, ~skipped, out=valid)
    np.logical_or(first, skipped, out=first)
    return int(skipped.sum())


def keep_final_obs(slot: int, t: int, truncated: np.ndarray, scratch: np.ndarray, final_obs: np.ndarray,
                   final_step: np.ndarray) -> None:
    """Store the final observation of each env truncated at step t, if it is the env's first in the slot."""
    first = truncated[slot, t] & (final_step[slot] == NO_FINAL)
    if first.any():
        final_obs[slot, first] = scratch[first]
        final_step[slot, first] = t


class RolloutStage:
    """`splits` env splits of the run's splits `first_split`.. (a rollout worker's; all of them in `--serial`)."""

    def __init__(self, cfg: Config, traj: SharedArrays, splits: int, first_split: int, events: EnvEvents,
                 generation: int = 0):
        self.cfg, self.events = cfg, events
        self.first_split, self.generation = first_split, generation
        self.obs, self.final_obs = obs_arrays(traj, "obs"), obs_arrays(traj, "final_obs")
        self.actions, self.rewards, self.valid = traj["actions"], traj["rewards"], traj["valid"]
        self.terminated, self.truncated = traj["terminated"], traj["truncated"]
        self.first, self.final_step = traj["first"], traj["final_step"]
        self.state = list(state_arrays(traj).values())  # none for a feed-forward actor
        row = self.obs[0, 0]
        self.final_scratch = [zeros_like(row) for _ in range(splits)]  # the backend's final observations
        self.carry = [zeros_like(row) for _ in range(splits)]  # the row in transit to the next slot
        self.carry_first = [np.zeros_like(self.first[0, 0]) for _ in range(splits)]
        self.carry_state = [[np.zeros_like(a[0, 0]) for a in self.state] for _ in range(splits)]
        self.slots = [0] * splits
        self.steps = [0] * splits
        self.errors = 0  # env errors so far: each one reseeds the next reset
        self.envs: list[VecEnv] = []

    # ----- envs -----
    def make_envs(self) -> list[VecEnv]:
        cfg = self.cfg
        try:
            self.envs = [make_vec_env(cfg, cfg.envs_per_split, training=True) for _ in self.slots]
            for env in self.envs:
                env.info_keys = cfg.info_key_names
        except EnvError as exc:  # bad input: a callable that returns no env, or a VectorEnv of the wrong size
            raise StageFatal(str(exc), exit_code=2) from None
        except Exception as exc:
            raise StageFatal(f"env {cfg.env} could not be created: {type(exc).__name__}: {exc}") from None
        return self.envs

    def tell_curricula(self, info: dict) -> None:
        """The run's progress (frames, env steps, policy version, mean return) for envs that want it."""
        for env in self.envs:
            if env.wants_training_info:  # curriculum envs
                env.set_training_info(info)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def seed(self, split: int) -> int:
        return split_seed(self.cfg, self.first_split + split, self.generation, self.errors)

    # ----- slots -----
    def begin(self, split: int, slot: int) -> None:
        """Hold `slot` for `split` and reset the split's envs into its first row (every env starts an episode)."""
        self.slots[split], self.steps[split] = slot, 0
        self.final_step[slot] = NO_FINAL
        self._reset(split, slot, 0)

    def _reset(self, split: int, slot: int, t: int) -> None:
        try:
            self.envs[split].reset(seed=self.seed(split), obs_out=self.obs[slot, t])
        except EnvBroken as exc:
            raise StageFatal(str(exc)) from None
        except Exception as exc:  # a backend that cannot replace one env: no episode can start
            raise StageFatal(f"{self.cfg.env} env failed before its first step: {type(exc).__name__}: {exc}") from None
        self.first[slot, t] = True
        faults = getattr(self.envs[split], "faults", None)
        if faults:  # instances replaced during the reset: counted, nothing to leave out
            self._replaced(split, slot, None, faults)

    def step(self, split: int) -> Stepped:
        """Step the split's envs with the actions in its current row; the row after it gets the observations."""
        slot, t = self.slots[split], self.steps[split]
        env, valid, first = self.envs[split], self.valid, self.first
        terminated, truncated = self.terminated, self.truncated
        valid[slot, t] = True
        steps, errors = self.cfg.envs_per_split, 0
        try:
            finished = env.step(self.actions[slot, t], self.obs[slot, t + 1], self.rewards[slot, t],
                                terminated[slot, t], truncated[slot, t], self.final_scratch[split])
        except EnvInfoError as exc:  # bad input: a metric that is not a number
            raise StageFatal(str(exc), exit_code=2) from None
        except EnvBroken as exc:  # a fresh instance failed before its first step
            raise StageFatal(str(exc)) from None
        except Exception as exc:  # a backend that cannot replace one env: the step is lost, the split starts afresh
            finished, steps, errors = [], 0, self.cfg.envs_per_split
            self.errors += errors
            valid[slot, t] = terminated[slot, t] = truncated[slot, t] = False
            self.rewards[slot, t] = 0.0
            self.events.env_error(f"{type(exc).__name__}: {exc}", "step", errors, split,
                                  "reset the split's envs (the step left out of training)")
            self._reset(split, slot, t + 1)
        else:
            np.logical_or(terminated[slot, t], truncated[slot, t], out=first[slot, t + 1])  # episode ends -> starts
            skipped = env.skipped
            if skipped is not None and skipped.any():  # the env's own reset (NEXT_STEP): no agent step
                steps -= skip_reset_rows(skipped, valid[slot, t], first[slot, t + 1])
            faults = getattr(env, "faults", None)
            if faults:  # env instances the backend replaced
                errors = self._replaced(split, slot, t, faults)
            if finished:
                keep_final_obs(slot, t, truncated, self.final_scratch[split], self.final_obs, self.final_step)
        self.steps[split] = t + 1
        return Stepped(steps, errors, finished, t + 1 == self.cfg.rollout)

    def _replaced(self, split: int, slot: int, t: int | None, faults: list[EnvFault]) -> int:
        """Env instances the split's backend replaced in step t (None: at a reset): a failed step is left out of
        training, and the fresh instance's first observation starts an episode. Returns their count."""
        for fault in faults:
            if t is not None:
                self.first[slot, t + 1, fault.index] = True
                if fault.where == "step":
                    self.valid[slot, t, fault.index] = False
        count, last = len(faults), faults[-1]
        self.errors += count
        left_out = ", the step left out of training" if last.where == "step" else ""
        self.events.env_error(last.message, last.where, count, split,
                              f"replaced env {split * self.cfg.envs_per_split + last.index} with a fresh instance "
                              f"(its episode dropped{left_out})")
        faults.clear()
        return count

    def hand_over(self, split: int) -> int:
        """Copy out the row that starts the split's next trajectory; the full slot (returned) is no longer read."""
        slot, t = self.slots[split], self.cfg.rollout
        self.carry[split][...] = self.obs[slot, t]
        self.carry_first[split][...] = self.first[slot, t]
        for kept, a in zip(self.carry_state[split], self.state):
            kept[...] = a[slot, t]
        return slot

    def take_over(self, split: int, slot: int) -> None:
        """Continue the split's trajectory in `slot` from the row `hand_over` copied out."""
        self.final_step[slot] = NO_FINAL
        self.obs[slot, 0] = self.carry[split]
        self.first[slot, 0] = self.carry_first[split]
        for kept, a in zip(self.carry_state[split], self.state):
            a[slot, 0] = kept
        self.slots[split], self.steps[split] = slot, 0
