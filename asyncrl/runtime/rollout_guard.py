"""A rollout worker's fault handling, kept out of its hot loop.

- An env that raises in `step` or `reset` is reset (its split's trajectory starts over in the same slot) and
  counted; after `ENV_ERROR_LIMIT` errors the worker exits with `EXIT_ENV_ERRORS` and the runner restarts it
  with fresh envs. An env that cannot even be created makes the worker exit the same way.
- While the worker waits for actions it still beats its heartbeat, and when a policy worker has been
  restarted (`policy_epoch` changed) it re-sends the requests that were not answered: the dead policy worker
  may have taken them off the queue. The `want`/`acted` handshake (see `asyncrl.runtime.liveness`) makes
  the duplicates harmless.
"""

from __future__ import annotations

import time
from typing import NoReturn

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import VecEnv
from asyncrl.envs.registry import make_vec_env
from asyncrl.runtime.channels import Channels, report
from asyncrl.runtime.liveness import NO_OWNER, write_words

ENV_ERROR_LIMIT = 5  # env exceptions one worker process absorbs before it gives up (and is restarted)
EXIT_ENV_ERRORS = 3  # exit code of a rollout worker that gave up on its envs


class RolloutGuard:
    def __init__(self, worker: int, cfg: Config, channels: Channels, obs: np.ndarray, slots: list[int],
                 steps: list[int]):
        self.worker, self.cfg, self.channels = worker, cfg, channels
        self.obs, self.slots, self.steps = obs, slots, steps
        live = channels.live
        self.beat, self.owner = live["beat_rollout"], live["slot_owner"]
        self.want, self.acted = live["want"], live["acted"]
        self.env_errors, self.policy_epoch = live["env_errors"], live["policy_epoch"]
        self.epoch = int(self.policy_epoch[0])
        self.generation = int(live["incarnation"][worker])
        self.errors = 0
        self.envs: list[VecEnv] = []

    def make_envs(self) -> list[VecEnv]:
        cfg = self.cfg
        try:
            self.envs = [make_vec_env(cfg.env, cfg.envs_per_split, training=True, num_threads=cfg.env_threads,
                                      max_episode_frames=cfg.max_episode_frames)
                         for _ in range(cfg.worker_splits)]
        except Exception as exc:
            self._give_up(f"could not create them: {type(exc).__name__}: {exc}")
        return self.envs

    def seed(self, split: int) -> int:
        """The original seeds on a first start; different ones after restarts and env errors."""
        cfg = self.cfg
        base = cfg.seed * 1_000_003 + (self.worker * cfg.worker_splits + split) * cfg.envs_per_split
        return base + 7_919 * (self.generation * (ENV_ERROR_LIMIT + 1) + self.errors)

    def begin(self, split: int, slot: int) -> None:
        """Hold `slot` for `split`, reset the split's envs into its first step and ask for actions."""
        self.owner[slot] = self.worker
        self.slots[split], self.steps[split] = slot, 0
        while True:
            try:
                self.envs[split].reset(seed=self.seed(split), obs_out=self.obs[slot, 0])
                break
            except Exception as exc:
                self.env_error(exc, "reset")
        self.acted[slot] = NO_OWNER
        self.want[slot] = 0
        self.channels.requests.put((self.worker, split, slot, 0))

    def env_error(self, exc: Exception, where: str) -> None:
        """Count an env exception; give up (exit) past the limit."""
        self.errors += 1
        self.env_errors[self.worker] += 1
        message = f"{type(exc).__name__}: {exc}"
        if self.errors > ENV_ERROR_LIMIT:
            self._give_up(f"{self.errors} env errors, the last in {where}: {message}")
        report(self.channels, "env_error", self.worker,
               {"message": message, "where": where, "count": self.errors, "worker": self.worker})

    def _give_up(self, message: str) -> NoReturn:
        write_words(self.channels.live, self.worker, message)  # the runner reads it when it sees us gone
        raise SystemExit(EXIT_ENV_ERRORS)

    def idle(self) -> None:
        """Called while waiting for actions: heartbeat, and re-send requests a dead policy worker lost."""
        self.beat[self.worker] = time.monotonic()
        self.check_policy_restarts()

    def heartbeat(self) -> None:
        self.beat[self.worker] = time.monotonic()

    def check_policy_restarts(self, skip: int = -1) -> None:
        """If a policy worker was restarted since the last look, re-send every unanswered request."""
        if self.policy_epoch[0] == self.epoch:
            return
        self.epoch = int(self.policy_epoch[0])
        for split, slot in enumerate(self.slots):
            if split == skip:
                continue
            t = self.steps[split]
            if self.acted[slot] == t:  # answered; only the wake-up may have been lost
                self.channels.actions_ready[self.worker].put(split)
            else:
                self.channels.requests.put((self.worker, split, slot, t))
