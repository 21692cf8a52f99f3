"""The learner stage: full trajectory slots copied out, trained on, and the new policy published, knowing nothing of
processes.

`gather` copies a batch of slots out (after it the slots may be handed back: the stage never reads them again),
`train` runs the update of the learner that `--algo` names (each policy's, on its own rows, with
`--num-policies`) and publishes each policy's new version through its `Publisher`: the shared weights block
that the policy workers read (`WeightsPublisher`), or the acting model in the same process (`LocalPublisher`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from torch import nn

from asyncrl.agents.base import Learner
from asyncrl.agents.batch import Batch, gather_batch
from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import flat_state
from asyncrl.shm import SharedArrays, SharedWeights


class Publisher(Protocol):
    """Makes a learner's policy weights (`tensors`, in `flat_state` order) the acting policy's, as `version`."""

    tensors: list[torch.Tensor]

    def publish(self, version: int) -> None: ...


class WeightsPublisher:
    """Flattens the model's float tensors into the shared weights buffer after every optimizer step."""

    def __init__(self, model: nn.Module, weights: SharedWeights):
        self.tensors = flat_state(model)
        numel = sum(t.numel() for t in self.tensors)
        self.weights = weights
        self.shared = weights.allocate(numel)
        self.staging = torch.empty(numel, dtype=torch.float32)

    def publish(self, version: int) -> None:
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                self.staging[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
                offset += t.numel()
        self.weights.publish(self.staging.numpy(), version)


class LocalPublisher:
    """Copies the learner's policy weights into an acting model in the same process (`--serial`). `publish` only
    marks a version due; `release` copies it, so the caller decides which steps still act on the older one."""

    def __init__(self, model: nn.Module, acting: nn.Module):
        self.tensors = flat_state(model)
        self.targets = flat_state(acting)
        self.version = self.due = 0

    def publish(self, version: int) -> None:
        self.due = version

    def release(self) -> None:
        """The acting model takes the weights of the version due (those the learner holds now)."""
        if self.due != self.version:
            with torch.no_grad():
                for dst, src in zip(self.targets, self.tensors):
                    dst.copy_(src)
            self.version = self.due


def staged_weights(publisher: Publisher) -> np.ndarray:
    """The published weights as one flat float32 array (the initial-weights checksum's input)."""
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in publisher.tensors]).numpy()


class LearnerStage:
    """Trains `learners` (one per policy) on batches of full slots and publishes each through its publisher.

    `agree` (torchrun: counters and stopping agreed with the other ranks before publishing) and `after_update`
    (--self-play: the snapshot pool) are the hooks a transport may set."""

    def __init__(self, spec: EnvSpec, traj: SharedArrays, device: torch.device, learners: list[Learner],
                 publishers: list[Publisher], collected: int = 0):
        self.spec, self.traj, self.device = spec, traj, device
        self.learners, self.publishers = learners, publishers
        self.population = "policy" in traj  # gathered at version 0: each policy counts the lag from its own
        self.collected = collected  # agent steps in the batches taken so far
        self.agree: Callable[[Learner, dict], None] | None = None
        self.after_update: Callable[[int, Learner], None] | None = None

    def gather(self, slots: list[int]) -> Batch:
        """Copy the slots out (time-major, on the learner's device); they are not read again."""
        version = 0 if self.population else self.learners[0].version
        return gather_batch(self.traj, np.asarray(slots, dtype=np.int64), version, self.device)

    def train(self, batch: Batch, timing: dict[str, float]) -> list[dict]:
        """One update of each policy that acted in `batch`, each published; their stats (`timing`, the transport's
        wait and copy times, counted once per batch)."""
        reports = []
        for p, (member, publisher) in enumerate(zip(self.learners, self.publishers)):
            rows = batch.policy_rows(p, member.version) if self.population else batch
            if rows is None:  # this policy did not act in the batch
                continue
            t_start = time.monotonic()
            # The learning-rate schedule's progress: one policy's own samples, a population's run frames (so
            # a schedule over --frames ends where the run ends for every policy)
            progress = self.collected if self.population else member.samples_trained
            stats = member.train(rows, progress * self.spec.frameskip)
            if self.agree is not None:
                self.agree(member, stats)
            publisher.publish(member.version)
            if self.after_update is not None:
                self.after_update(p, member)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            stats.update(timing, t_train=time.monotonic() - t_start, **({"policy": p} if self.population else {}))
            timing = {"t_wait": 0.0, "t_copy": 0.0}
            reports.append(stats)
        # Agent steps, as the runner counts them: a NEXT_STEP env's reset rows are not (invalid, like failed steps)
        self.collected += batch.rewards.numel() if batch.valid is None else int(batch.valid.sum())
        return reports
