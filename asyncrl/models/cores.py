"""Recurrent cores (`--rnn gru|lstm`): between the encoder and the policy and value heads, carrying a per-env state.

A core's state is a dict of per-env tensors, [N, rnn_layers, rnn_size] each ("h" for the GRU, "h" and "c" for
the LSTM), as the trajectory slots store it (`asyncrl.models.registry.core_state_layout`, the torch-free twin of
`state_layout()`). Registered by name in `asyncrl.models.registry.CORES`.

- `forward(x [L, N, F], state) -> (out [L, N, size], state after the L steps)`: L steps without resets.
- `unroll(x [T, B, F], first [T, B], state)`: T steps from `state`, the state of env b set to zero before any
  step t where `first[t, b]` (its episode starts there), as acting reset it. Runs the steps between resets as
  one call each; the same numbers as stepping one at a time.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

State = dict[str, torch.Tensor]


def reset_rows(state: State, first: torch.Tensor) -> State:
    """`state` with the rows of envs whose episode starts (`first` [N]) set to zero."""
    return {k: v.masked_fill(first.reshape(-1, *(1,) * (v.dim() - 1)).bool(), 0) for k, v in state.items()}


class RecurrentCore(nn.Module):
    """A torch RNN of `layers` layers of `size` units over features of width `input_size` (time-major)."""

    state_keys: tuple[str, ...] = ("h",)
    rnn_class: type[nn.RNNBase] = nn.GRU
    # Which of the torch RNN's gate blocks decides how much of the state is kept: the GRU's update gate z (r, z, n;
    # h' = (1 - z) n + z h), the LSTM's forget gate f (i, f, g, o).
    keep_gate = 1

    def __init__(self, input_size: int, size: int, layers: int = 1):
        super().__init__()
        self.size, self.layers = int(size), int(layers)
        self.rnn = self.rnn_class(input_size, self.size, self.layers)
        self.out_features = self.size
        # The keeping gates start at bias 1 (Jozefowicz et al. 2015): at torch's 0 a core keeps half of its state
        # per step, 0.5^11 of a cue eleven steps back. On tests/test_memory.py's cue task the GRU's 100-episode mean
        # first reached 0.9 after 11.3k-16.1k env steps in six runs, where bias 0 took 24.3k-35.1k in four.
        keep = slice(self.keep_gate * self.size, (self.keep_gate + 1) * self.size)
        with torch.no_grad():
            for layer in range(self.layers):
                getattr(self.rnn, f"bias_ih_l{layer}")[keep].fill_(1.0)
                getattr(self.rnn, f"bias_hh_l{layer}")[keep].zero_()

    def state_layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {k: ((self.layers, self.size), np.dtype(np.float32)) for k in self.state_keys}

    def initial_state(self, n: int, device: torch.device | str | None = None) -> State:
        return {k: torch.zeros(n, self.layers, self.size, device=device) for k in self.state_keys}

    def forward(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        torch_state = tuple(state[k].transpose(0, 1).contiguous() for k in self.state_keys)  # [layers, N, size]
        out, after = self.rnn(x, torch_state[0] if len(torch_state) == 1 else torch_state)
        after = (after,) if isinstance(after, torch.Tensor) else after
        return out, {k: v.transpose(0, 1) for k, v in zip(self.state_keys, after)}

    def cell_step(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One step written out in plain tensor operations (matmuls and gates) on the same weights: x [N, F] ->
        (out [N, size], next state). What the acting head (load_policy, enjoy) and the exported files compute,
        so exporters translate elementary operations, not their own version of the RNN op; equal to `forward`
        to float rounding."""
        layers_out = []
        for layer in range(self.layers):
            w_ih, w_hh = getattr(self.rnn, f"weight_ih_l{layer}"), getattr(self.rnn, f"weight_hh_l{layer}")
            b_ih, b_hh = getattr(self.rnn, f"bias_ih_l{layer}"), getattr(self.rnn, f"bias_hh_l{layer}")
            x, new = self._cell(x @ w_ih.t() + b_ih, {k: v[:, layer] for k, v in state.items()}, w_hh, b_hh)
            layers_out.append(new)
        return x, {k: torch.stack([new[k] for new in layers_out], dim=1) for k in self.state_keys}

    def _cell(self, gates_x: torch.Tensor, state: State, w_hh: torch.Tensor,
              b_hh: torch.Tensor) -> tuple[torch.Tensor, State]:
        """torch.nn.GRU's cell: r, z from the sum of both projections, n = tanh(x_n + r * (W_hn h + b_hn))."""
        h = state["h"]
        gates_h = h @ w_hh.t() + b_hh
        x_r, x_z, x_n = gates_x.chunk(3, dim=-1)
        h_r, h_z, h_n = gates_h.chunk(3, dim=-1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h
        return h, {"h": h}

    def unroll(self, x: torch.Tensor, first: torch.Tensor, state: State,
               cuts: Iterable[int] = ()) -> tuple[torch.Tensor, dict[int, State]]:
        """(out [T, B, size], {t: the state before step t's reset}) for every t > 0 at which a run of steps starts:
        where some env's episode starts, and at the given `cuts` (e.g. the step after a truncation, whose state a
        final observation's value needs)."""
        t_len = x.shape[0]
        starts = torch.nonzero(first[1:].any(dim=1)).flatten().add(1).tolist() if t_len > 1 else []
        bounds = sorted({0, t_len, *starts, *(int(c) for c in cuts if 0 < int(c) < t_len)})
        state = reset_rows(state, first[0])
        outs, before = [], {}
        for a, b in zip(bounds[:-1], bounds[1:]):
            if a > 0:
                before[a] = state
                state = reset_rows(state, first[a])
            out, state = self(x[a:b], state)
            outs.append(out)
        return torch.cat(outs) if len(outs) > 1 else outs[0], before


class GRUCore(RecurrentCore):
    """`--rnn gru`: state "h"."""


class LSTMCore(RecurrentCore):
    """`--rnn lstm`: state "h" (the hidden state) and "c" (the cell)."""

    state_keys = ("h", "c")
    rnn_class = nn.LSTM

    def _cell(self, gates_x: torch.Tensor, state: State, w_hh: torch.Tensor,
              b_hh: torch.Tensor) -> tuple[torch.Tensor, State]:
        """torch.nn.LSTM's cell: input, forget, cell and output gates in that order."""
        h, c = state["h"], state["c"]
        i, f, g, o = (gates_x + h @ w_hh.t() + b_hh).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, {"h": h, "c": c}


def build_core(name: str, input_size: int, size: int, layers: int) -> RecurrentCore:
    """The core `--rnn name` names (`asyncrl.models.registry.CORES`)."""
    from asyncrl.models.registry import CORES, resolve

    return resolve(CORES[name])(input_size, size, layers)
