"""A rollout worker's fault handling, kept out of its hot loop.

- An env instance that raises is replaced by the backend (`GymVecEnv`) with a fresh one; the guard marks
  the step invalid in the slot (`valid`: the learner leaves it out of the loss and cuts the V-trace trace
  there), counts it and reports it. A backend that cannot replace one instance (Atari's C++ vector env)
  raises instead: the split's envs are reset and its trajectory starts over in the same slot. Errors are
  judged as a rate by the runner (`--max-env-error-rate`), not counted against the worker.
- Envs that cannot be created, or fresh instances that fail before their first step (`EnvBroken`), stop
  the run at once with a fatal report: restarting the worker would only fail again.
- While the worker waits for actions it still beats its heartbeat, and when a policy worker has been
  restarted (`policy_epoch` changed) it re-sends the requests that were not answered: the dead policy worker
  may have taken them off the queue. The `want`/`acted` handshake (see `asyncrl.runtime.plumbing.liveness`) makes
  the duplicates harmless.
"""

from __future__ import annotations

import time
from typing import NoReturn

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvBroken, EnvError, EnvFault, VecEnv
from asyncrl.envs.registry import make_vec_env
from asyncrl.runtime.plumbing.channels import Channels, Full, report
from asyncrl.runtime.plumbing.liveness import NO_OWNER

EXIT_ENV_ERRORS = 3  # exit code of a rollout worker whose envs broke and that could not even report it
FATAL_PUT_TIMEOUT_S = 10.0


def split_seed(cfg: Config, split: int, generation: int = 0, errors: int = 0) -> int:
    """The reset seed of the run's split `split` (worker x --worker-splits + its split): the original seeds on a
    first start, different ones after a worker's restarts (`generation`) and its env errors."""
    base = cfg.seed * 1_000_003 + split * cfg.envs_per_split
    return base + 7_919 * (generation * 1_000_003 + errors)


class RolloutGuard:
    def __init__(self, worker: int, cfg: Config, channels: Channels, obs: np.ndarray, valid: np.ndarray,
                 slots: list[int], steps: list[int], first: np.ndarray):
        self.worker, self.cfg, self.channels = worker, cfg, channels
        self.obs, self.valid, self.slots, self.steps = obs, valid, slots, steps
        self.first = first  # the slots' episode-start flags: a reset, a replaced env instance
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
            self.envs = [make_vec_env(cfg, cfg.envs_per_split, training=True) for _ in range(cfg.worker_splits)]
            for env in self.envs:
                env.info_keys = cfg.info_key_names
        except EnvError as exc:  # bad input: a callable that returns no env, or a VectorEnv of the wrong size
            self.fatal(str(exc), exit_code=2)
        except Exception as exc:
            self.fatal(f"env {cfg.env} could not be created: {type(exc).__name__}: {exc}")
        return self.envs

    def faults(self) -> list[list[EnvFault]]:
        """Each split's backend fault list (empty, and never growing, for backends that do not replace envs)."""
        return [getattr(env, "faults", []) for env in self.envs]

    def seed(self, split: int) -> int:
        """The original seeds on a first start; different ones after restarts and env errors."""
        return split_seed(self.cfg, self.worker * self.cfg.worker_splits + split, self.generation, self.errors)

    def before_request(self, split: int, slot: int, t: int) -> None:  # noqa: B027 - the worker sets its own
        """What the worker writes into step t's row before asking for its actions (which policy acts where)."""

    def begin(self, split: int, slot: int) -> None:
        """Hold `slot` for `split`, reset the split's envs into its first step and ask for actions."""
        self.owner[slot] = self.worker
        self.slots[split], self.steps[split] = slot, 0
        try:
            self.envs[split].reset(seed=self.seed(split), obs_out=self.obs[slot, 0])
        except EnvBroken as exc:
            self.fatal(str(exc))
        except Exception as exc:  # a backend that cannot replace one env: no episode can start
            self.fatal(f"{self.cfg.env} env failed before its first step: {type(exc).__name__}: {exc}")
        self.first[slot, 0] = True  # every env of the split starts an episode
        self.replaced(split, slot, None)
        self.acted[slot] = NO_OWNER
        self.want[slot] = 0
        self.before_request(split, slot, 0)
        self.channels.requests.put((self.worker, split, slot, 0))

    def env_error(self, exc: Exception, where: str) -> None:
        """Count an exception of a backend that could not replace the failing env (the split starts over)."""
        self.errors += 1
        self.env_errors[self.worker] += 1
        report(self.channels, "env_error", self.worker,
               {"message": f"{type(exc).__name__}: {exc}", "where": where, "count": self.errors,
                "worker": self.worker, "action": "reset the split's envs (its trajectory starts over)"})

    def replaced(self, split: int, slot: int, t: int | None) -> int:
        """Count the env instances the split's backend replaced (returned); a failed step `t` is marked invalid,
        and the fresh instance's first observation (at t + 1) starts an episode."""
        faults = getattr(self.envs[split], "faults", None)
        if not faults:
            return 0
        for fault in faults:
            if t is not None:
                self.first[slot, t + 1, fault.index] = True
                if fault.where == "step":
                    self.valid[slot, t, fault.index] = False
        self.errors += len(faults)
        self.env_errors[self.worker] += len(faults)
        last = faults[-1]
        report(self.channels, "env_error", self.worker,
               {"message": last.message, "where": last.where, "count": self.errors, "worker": self.worker,
                "action": f"replaced env {split * self.cfg.envs_per_split + last.index} with a fresh instance "
                          f"(its episode dropped{', the step left out of training' if last.where == 'step' else ''})"})
        count = len(faults)
        faults.clear()
        return count

    def fatal(self, message: str, exit_code: int = 1) -> NoReturn:
        """Stop the run: report (never dropped), then wait for the runner's stop so it reads the report first.
        `exit_code` is the run's (2: bad input)."""
        try:
            self.channels.reports.put(("fatal", self.worker, time.time(), {"message": f"rollout-{self.worker}: "
                                       f"{message}; stopping.", "code": "env_broken", "exit_code": exit_code}),
                                      timeout=FATAL_PUT_TIMEOUT_S)
        except Full:
            raise SystemExit(EXIT_ENV_ERRORS) from None
        while not self.channels.stopping:
            self.heartbeat()
            time.sleep(0.05)
        raise SystemExit(0)

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
