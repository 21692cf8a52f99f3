"""Planted faults: envs that fail in set ways, and `asyncrl-train` with a fault planted in the learner.

Envs, loaded by name (`--env tests.faults:<callable>`, with the repository root on PYTHONPATH):
- `make_flaky_env`: CartPole whose every instance raises once, at its `FLAKY_AT`-th step (test_reliability.py).
- `make_broken_env`: CartPole that raises in every `reset`.
- `make_hang_once_env`: CartPole; the first instance (in the whole run) to reach `HANG_AT` steps sleeps forever.
  "First" is decided by creating a marker file in `$ASYNCRL_FAULT_DIR`, so a restarted worker does not hang.
- `make_huge_obs_env`: observations bigger than this machine's free RAM (the space only claims the shape).
- `make_flaky_cartpole`: CartPole whose every instance raises at every `RAISE_EVERY`-th step, the step lost as when
  a simulator crashes; `make_crashing_cartpole` raises at every step (test_env_recovery.py).
- `make_slow_cartpole`: CartPole whose every step sleeps `STEP_SLEEP_S`, an environment-bound run
  (test_diagnostics_e2e.py, test_eval.py).
- `make_nan_reward_cartpole`: CartPole whose rewards turn NaN `NAN_AFTER_S` seconds after an instance's first step.

Learner faults: `python -m tests.faults ARGS` runs `asyncrl-train ARGS` with `$ASYNCRL_FAULT` planted:
- `learner_raise`: the learner's `train` raises after `LEARNER_FAULT_AFTER` updates.
- `learner_hang`: the learner's `train` sleeps forever after `LEARNER_FAULT_AFTER` updates.
- `learner_fsize:BYTES`: the learner process may not write files larger than BYTES (RLIMIT_FSIZE), so saving a
  checkpoint fails in the kernel (EFBIG) as it would on a full disk.
- `tensorboard_enospc`: in the runner, TensorBoard's writer thread gets ENOSPC ("No space left on device") at every
  write after the event file's first record, as on a disk that fills mid-run.
"""

from __future__ import annotations

import errno
import os
import resource
import sys
import time

import gymnasium as gym
import numpy as np
import psutil

FLAKY_AT = 300
HANG_AT = 200
LEARNER_FAULT_AFTER = 20
RAISE_EVERY = 500  # steps per env instance between two errors of make_flaky_cartpole
STEP_SLEEP_S = 0.002  # a slow simulator: ~2 ms per step, far above the framework's per-step cost
NAN_AFTER_S = 5.0  # seconds after an env's first step at which its rewards turn NaN


class FaultAtStep(gym.Wrapper):
    """Calls `fault()` at the wrapped env's `at`-th step."""

    at = 0

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            self.fault()
        return self.env.step(action)

    def fault(self) -> None:
        raise NotImplementedError


class RaiseOnce(FaultAtStep):
    at = FLAKY_AT

    def fault(self) -> None:
        raise RuntimeError("planted env fault")


class RaiseInReset(gym.Wrapper):
    def reset(self, **kwargs):
        raise RuntimeError("planted reset fault")


class HangOnce(FaultAtStep):
    at = HANG_AT

    def fault(self) -> None:
        if _claim("hang"):
            time.sleep(3600)


def _claim(name: str) -> bool:
    """True for the first caller in the run (across processes and restarts), False for every later one."""
    folder = os.environ.get("ASYNCRL_FAULT_DIR")
    if not folder:
        return False
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class HugeObsEnv(gym.Env):
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        space = gym.spaces.Box(0, 255, (1,), np.uint8)
        space._shape = (psutil.virtual_memory().available // 4,)  # claimed only: never allocated
        self.observation_space = space


class RaiseEvery(gym.Wrapper):
    """Raises at every `every`-th step of this instance (the step is lost, as when a simulator crashes)."""

    def __init__(self, env: gym.Env, every: int) -> None:
        super().__init__(env)
        self.every, self.steps = every, 0

    def step(self, action):
        self.steps += 1
        if self.steps % self.every == 0:
            raise RuntimeError(f"simulator crashed at step {self.steps}")
        return self.env.step(action)


class SlowStep(gym.Wrapper):
    """Sleeps before every step, so stepping the env dominates the rollout workers' time."""

    def step(self, action):
        time.sleep(STEP_SLEEP_S)
        return self.env.step(action)


class NanRewardAfter(gym.Wrapper):
    """Normal rewards for the first `NAN_AFTER_S` seconds of stepping, NaN ever after."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.t_first: float | None = None

    def step(self, action):
        now = time.monotonic()
        self.t_first = now if self.t_first is None else self.t_first
        obs, reward, terminated, truncated, info = self.env.step(action)
        if now - self.t_first >= NAN_AFTER_S:
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def make_flaky_env() -> gym.Env:
    return RaiseOnce(gym.make("CartPole-v1"))


def make_broken_env() -> gym.Env:
    return RaiseInReset(gym.make("CartPole-v1"))


def make_hang_once_env() -> gym.Env:
    return HangOnce(gym.make("CartPole-v1"))


def make_huge_obs_env() -> gym.Env:
    return HugeObsEnv()



def make_flaky_cartpole() -> gym.Env:
    return RaiseEvery(gym.make("CartPole-v1"), RAISE_EVERY)


def make_crashing_cartpole() -> gym.Env:
    return RaiseEvery(gym.make("CartPole-v1"), 1)


def make_slow_cartpole() -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"))


def make_nan_reward_cartpole() -> gym.Env:
    return NanRewardAfter(gym.make("CartPole-v1"))

def _plant_learner_fault(kind: str) -> None:
    from asyncrl.agents.appo.learner import APPOLearner

    original = APPOLearner.train
    calls = [0]

    def train(self, batch, frames):
        calls[0] += 1
        if calls[0] > LEARNER_FAULT_AFTER:
            if kind == "learner_raise":
                raise RuntimeError("planted learner fault")
            time.sleep(3600)
        return original(self, batch, frames)

    APPOLearner.train = train


def _plant_file_size_limit(limit: int) -> None:
    from asyncrl.runtime.roles import learner

    original = learner.init_child

    def init_child(*args, **kwargs) -> None:
        original(*args, **kwargs)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    learner.init_child = init_child


def _plant_tensorboard_enospc() -> None:
    from tensorboard.summary.writer.record_writer import RecordWriter

    original = RecordWriter.write
    calls = [0]

    def write(self, data: bytes) -> None:
        calls[0] += 1
        if calls[0] > 1:  # the first is the file-version record written as the writer opens
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, data)

    RecordWriter.write = write


def main(argv: list[str]) -> int:
    kind = os.environ.get("ASYNCRL_FAULT", "")
    if kind == "tensorboard_enospc":
        _plant_tensorboard_enospc()
    elif kind.startswith("learner_fsize:"):
        _plant_file_size_limit(int(kind.partition(":")[2]))
    elif kind:
        _plant_learner_fault(kind)  # the learner is forked from this process, so it inherits the patch
    from asyncrl.cli.train import main as train_main

    return train_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
