"""What the learner process (`asyncrl.runtime.roles.learner`) needs from an algorithm.

A learner owns its networks, optimizers and update rule; the process around it owns the queues, the shared
weights, checkpoints and the stop rules. Adding an algorithm means one class that satisfies `Learner` and one
line in `asyncrl.agents.registry.LEARNERS` (docs/architecture.md, "Adding a learner").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from asyncrl.agents.batch import Batch
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec

GradientHook = Callable[[torch.nn.Module, torch.Tensor], None]


def no_gradient_sync(_model: torch.nn.Module, _loss: torch.Tensor) -> None:
    """The gradient hook of a single learner: nothing to average."""


def same_update_count(updates: int) -> int:
    """The update-count hook of a single learner: its own count is the agreed one."""
    return updates


def no_heartbeat() -> None:
    """The heartbeat outside a learner process: nothing to tell."""


@runtime_checkable
class Learner(Protocol):
    """One algorithm behind the learner process.

    Attributes the process and its data-parallel hooks (`asyncrl.runtime.distributed`, torchrun) use; every
    learner has all of them (the hooks start as the no-ops of this module, which the process replaces):
    - `cfg`, `spec`, `device`: as given to the constructor.
    - `model`: the module whose trainable parameters the data-parallel hook averages gradients over (and whose
      floating-point buffers it averages after each update); may hold more than `policy_module()`.
    - `optimizer`: the optimizer stepping `model`'s parameters.
    - `version`: the policy version, +1 per `train` call; the process publishes the policy under it.
    - `samples_trained`: samples trained on so far (the frame count learning-rate schedules use).
    - `lr`: the current learning rate (the data-parallel hook averages it over the ranks).
    - `nonfinite_streak`: consecutive skipped optimizer steps with a NaN/Inf loss or gradient; the process
      stops the run at `asyncrl.runtime.roles.learner.NONFINITE_LIMIT`.
    - `stat_names`: the stats `train` reports for the metrics (recorded as None until the first update).
    - `sync_gradients`: called as `sync_gradients(model, loss)` between `loss.backward()` and clipping; the
      process sets it to the data-parallel hook (default `no_gradient_sync`).
    - `agree_updates`: called as `agree_updates(n)` by a learner that runs a variable number `n` of gradient
      updates per `train` call, which then runs the number it returns; the process sets it to the ranks'
      minimum under torchrun (default `same_update_count`).
    - `heartbeat`: a learner whose `train` calls run long (replay, high UTD) calls it now and then; the process
      sets it to its liveness beat (default `no_heartbeat`).
    - `extra_parameters`: trainable tensors outside `model` (SAC's temperature) whose gradients the data-parallel
      hook averages too (default `()`).
    - `return_normalizer`: a running return normaliser whose moments the ranks pool, or None.
    """

    cfg: Config
    spec: EnvSpec
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    version: int
    samples_trained: int
    lr: float
    nonfinite_streak: int
    stat_names: tuple[str, ...]
    sync_gradients: GradientHook
    agree_updates: Callable[[int], int]
    heartbeat: Callable[[], None]
    extra_parameters: tuple[torch.Tensor, ...]
    return_normalizer: torch.nn.Module | None

    @staticmethod
    def build_policy(spec: EnvSpec, cfg: Config, device: torch.device) -> torch.nn.Module:
        """The acting network, as the policy workers build it: `policy_module()` has the same float tensors in
        the same order (`asyncrl.models.actor_critic.flat_state`). It must have `act(obs) -> (actions, logp)`."""
        ...

    def train(self, batch: Batch, frames: int) -> dict[str, float]:
        """Train on one gathered batch of full slots (`frames` trained on so far); numeric stats for the metrics
        (see `asyncrl.diagnostics.aggregate` for how the runner combines them)."""
        ...

    def policy_module(self) -> torch.nn.Module:
        """What the policy workers need, published after every update: no optimizer state, critics or targets."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: tensors and plain data only, so it loads with `torch.load(weights_only=True)`."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ActingHead(Protocol):
    """A published policy as the checkpoint consumers run it (`asyncrl.load_policy`, `asyncrl-enjoy`,
    `asyncrl-export`): a module from raw observations `[N, *obs_shape]` (the env's dtype) to `output_name`.

    - `forward(obs)`: what `asyncrl-export` writes to a file (TorchScript, ONNX); traceable, float32 out.
    - `actions(obs, sample)`: the env actions for a batch, greedy or sampled as the policy workers sample them.
    - `describe()`: policy.json's `preprocessing` (a list) and `output` (a dict) entries for `forward`'s output.
    """

    output_name: str

    def __call__(self, obs: torch.Tensor) -> torch.Tensor: ...

    def actions(self, obs: torch.Tensor, sample: bool) -> torch.Tensor: ...

    def describe(self) -> dict[str, Any]: ...


class PublishedPolicy(Protocol):
    """What a learner class tells everything that reads a run's checkpoints about the policy it publishes.

    The consumers (`asyncrl.policy`, `asyncrl.export`, `asyncrl-enjoy`, `runtime/store/best_checkpoint.py`) look the
    class up by the run's `algo` (`asyncrl.agents.registry.published_policy`) and build the policy with
    `build_policy`, load `state_dict()[policy_state_key]` into it and run it through `policy_head`.
    """

    policy_state_key: str  # the key of `Learner.state_dict()` holding `policy_module().state_dict()`

    @staticmethod
    def build_policy(spec: EnvSpec, cfg: Config, device: torch.device) -> torch.nn.Module: ...

    @staticmethod
    def policy_head(policy: torch.nn.Module, spec: EnvSpec) -> ActingHead:
        """`policy` (as `build_policy` makes it, with a checkpoint's weights) as an eval-mode `ActingHead`."""
        ...
