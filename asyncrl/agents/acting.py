"""Acting: observations (and a per-env recurrent state) -> actions, the one contract every actor keeps.

Everything that turns observations into actions goes through an `Actor`: the policy workers (sampled actions
for training), the evaluator (greedy and sampled), `asyncrl.load_policy`'s `Policy` and `asyncrl-enjoy` (the
run's acting head), and `asyncrl-export`, which writes the head's policy output (`forward`, what `act` draws
from; a recurrent head's takes the state as an input and returns it as an output).

- `state_layout()`: name -> (shape, numpy dtype) of the state an actor carries per env from one step to the
  next; {} for feed-forward models, the core's arrays for `--rnn` models (`asyncrl.models.actor_critic.
  RecurrentActorCritic` keeps this contract itself). The trajectory slots hold one `state/<name>` column per
  entry, [S, T + 1, E, *shape] (`asyncrl.runtime.plumbing.trajectories`).
- `initial_state(n)`: the state of `n` fresh episodes (zeros; {} without state).
- `act(obs, state, first, greedy=False) -> (actions, logp, next_state)`: `obs` [N, ...] (a Dict observation:
  a dict of such tensors), `state` {name: [N, *shape]} (the state before this step), `first` [N] bool (the
  env's episode starts at this step: the actor acts from `initial_state` there, whatever `state` holds; None
  is allowed only for an actor without state). Sampled actions are drawn as training draws them, greedy ones
  are the most likely; `logp` is the log-probability of the actions the distribution drew (before any clipping
  to the action bounds), and `next_state` the state after this step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from asyncrl.models.obs import Obs

State = dict[str, torch.Tensor]
StateLayout = dict[str, tuple[tuple[int, ...], np.dtype]]


@runtime_checkable
class Actor(Protocol):
    """See the module docstring."""

    def state_layout(self) -> StateLayout: ...

    def initial_state(self, n: int) -> State: ...

    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]: ...


def zero_state(layout: StateLayout, n: int, device: torch.device | str | None = None) -> State:
    """`n` envs' initial state for `layout`: zeros of each entry's shape and dtype ({} for an empty layout)."""
    return {k: torch.zeros((n, *shape), dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device=device)
            for k, (shape, dtype) in layout.items()}


def reset_where_first(state: State, first: torch.Tensor) -> State:
    """`state` with the rows of envs whose episode starts (`first`) set to the initial (zero) state."""
    return {k: v.masked_fill(first.reshape(-1, *(1,) * (v.dim() - 1)).bool(), 0) for k, v in state.items()}


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (of its first buffer when it has none; the CPU when neither)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


class FeedForward:
    """The state half of the contract for an actor without state: an empty layout, an empty state."""

    def state_layout(self) -> StateLayout:
        return {}

    def initial_state(self, n: int) -> State:
        return {}


class PublishedActor(FeedForward):
    """A published policy module (`Learner.build_policy`: the `ActorCritic`, an `OffPolicyActor`) as the policy
    workers and the evaluator act with it, on weights the learner keeps publishing.

    Sampled actions are the module's `act(obs) -> (actions, logp)` (the training-time draw: Gumbel-max for
    categorical heads, unclipped Gaussian samples, an off-policy actor's warm-up and exploration noise); greedy
    ones its `greedy(obs) -> (actions, logp)`.
    """

    def __init__(self, module: nn.Module):
        self.module = module

    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        actions, logp = self.module.greedy(obs) if greedy else self.module.act(obs)
        return actions, logp, state


def published_actor(module: nn.Module) -> Actor:
    """The actor of a published policy module: the module itself when it keeps the contract (a model with state
    does), else `PublishedActor(module)`."""
    return module if isinstance(module, Actor) else PublishedActor(module)
