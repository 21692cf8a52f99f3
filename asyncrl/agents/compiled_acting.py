"""The policy workers' act through torch.compile (`--compile inference|all`), requests padded to fixed sizes.

A policy worker's request is a whole number of worker splits (1 to `max_splits` of `rows_per_split` rows). The
compiled act sees only the sizes `bucket_sizes` lists (the splits' count rounded up to a power of two, capped
at the most a worker takes); rows past the request are zeros and are dropped from the result. Its graph is
compiled once, at start-up (`warm_up`, a progress line), with the row count dynamic: one compile serves every
size (a Nature CNN compiled per size took minutes on 2 busy cores), and CUDA graphs (`--compile-mode
reduce-overhead`) record one graph per padded size. Sampled actions come from the compiled graph's own random
stream (the eager distribution, other draws); greedy ones are eager's. A recurrent core steps through its cell
(`RecurrentCore.cell_step`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from asyncrl.agents.acting import State, published_actor
from asyncrl.agents.compiled import autocast, compile_fn, first_call
from asyncrl.agents.synthetic import zero_obs
from asyncrl.envs.base import EnvSpec
from asyncrl.models.actor_critic import ActorCritic, RecurrentActorCritic, greedy_from, sample_actions
from asyncrl.models.cores import reset_rows
from asyncrl.models.obs import Obs, map_obs


def bucket_sizes(rows_per_split: int, max_splits: int) -> list[int]:
    """The padded request sizes: rows_per_split x 1, 2, 4, ... splits, and the most a worker takes."""
    sizes, splits = [], 1
    while splits < max_splits:
        sizes.append(splits * rows_per_split)
        splits *= 2
    return [*sizes, max(1, max_splits) * rows_per_split]


def pure_act(model: ActorCritic, obs: Obs, state: State, first: torch.Tensor, dtype: torch.dtype | None,
             greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
    """Sampled (or greedy) actions, their log-probs and the state after, without data-dependent Python: what is
    compiled (one graph per padded size, and per `greedy`)."""
    with autocast(dtype, first.device):
        if isinstance(model, RecurrentActorCritic):
            obs = model._normalized(obs)
            core_out, after = model.core.cell_step(model._features(obs), reset_rows(state, first))
            out = model._policy(core_out, obs)
        else:
            out, after = model.policy_out(obs), state
    out = out.float()
    if greedy:
        actions = greedy_from(out, model.discrete, model.nvec, model.parts)
        return actions, model.distribution(out).log_prob(actions), after
    actions, logp = sample_actions(out, model.discrete, model.nvec, model.parts, getattr(model, "log_std", None))
    return actions, logp, after


def _pad(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[0] == size:
        return x
    return torch.cat([x, x.new_zeros((size - x.shape[0], *x.shape[1:]))])


class CompiledActor:
    """An APPO model (feed-forward or recurrent) keeping the acting contract (`asyncrl.agents.acting.Actor`)
    through a compiled `sampled_act` on padded requests."""

    def __init__(self, model: ActorCritic, spec: EnvSpec, rows_per_split: int, max_splits: int, mode: str = "default",
                 dtype: torch.dtype | None = None, backend: str | Callable = "inductor"):
        self.model, self.spec, self.dtype = model, spec, dtype
        self.eager = published_actor(model)  # the state half of the contract
        self.sizes = bucket_sizes(rows_per_split, max_splits)
        self.compiled: Callable = compile_fn(pure_act, mode, backend, dynamic=None)
        self.device = device = model.policy_head.weight.device
        self.no_first = {size: torch.zeros(size, dtype=torch.bool, device=device) for size in self.sizes}
        self.dynamic_rows = False  # the batch dimension marked dynamic yet (one graph for every padded size)

    def state_layout(self):  # type: ignore[no-untyped-def]
        return self.eager.state_layout()

    def initial_state(self, n: int) -> State:
        return self.eager.initial_state(n)

    def size_for(self, n: int) -> int:
        """The padded size of an `n`-row request (a larger request than any bucket keeps its own size)."""
        return next((s for s in self.sizes if s >= n), n)

    def act(self, obs: Obs, state: State, first: torch.Tensor | None,
            greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, State]:
        n = first.shape[0] if first is not None else next(iter(obs.values())).shape[0] if isinstance(obs, dict) \
            else obs.shape[0]
        size = self.size_for(n)
        padded_first = self.no_first[size] if first is None and size in self.no_first else (
            _pad(first.bool(), size) if first is not None else torch.zeros(size, dtype=torch.bool, device=self.device))
        obs, state = map_obs(obs, lambda x: _pad(x, size)), {k: _pad(v, size) for k, v in state.items()}
        if not self.dynamic_rows:  # the first call compiles for any row count (a size of 1 stays specialised)
            for x in (*(obs.values() if isinstance(obs, dict) else (obs,)), *state.values(), padded_first):
                torch._dynamo.maybe_mark_dynamic(x, 0)
            self.dynamic_rows = True
        with torch.no_grad():  # not inference_mode: its tensors would not match the graphs' guards (a recompile)
            actions, logp, after = self.compiled(self.model, obs, state, padded_first, self.dtype, greedy)
        return actions[:n], logp[:n], {k: v[:n] for k, v in after.items()}

    def warm_up(self) -> float:
        """Compile every padded size on zero observations; the seconds it took. CompileError when torch cannot."""
        device = self.model.policy_head.weight.device

        def all_sizes() -> None:
            for size in self.sizes:
                self.act(zero_obs(self.spec, (size,), device), self.initial_state(size),
                         torch.zeros(size, dtype=torch.bool, device=device))

        return first_call("the policy's act", all_sizes)
