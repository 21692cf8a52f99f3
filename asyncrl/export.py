"""Exporting a trained policy: a self-contained module from raw observations to the policy head's output.

The exported module is the run's algo's `ActingHead` (`asyncrl.agents.base`), which `asyncrl.load_policy`
uses too. For APPO (`asyncrl.agents.appo.head.PolicyHead`) it maps a batch of raw observations (the env's dtype and
shape, e.g. uint8 frames or float32 vectors) to action logits (discrete actions) or Gaussian action means
(continuous ones), applying every preprocessing step the trained model applies: the running observation
normaliser when the run used one (clipped to +-5), uint8 frames scaled to [0, 1] inside the CNN. For SAC, TD3
and REDQ (`asyncrl.agents.off_policy.learner.OffPolicyHead`) it maps them to the greedy action within the action
bounds. It always computes in float32.

A policy trained with --rnn is exported with its recurrent state as inputs and outputs: `(obs, h) -> (out, h)`
for a GRU, `(obs, h, c) -> (out, h, c)` for an LSTM (each state [N, rnn_layers, rnn_size], zeros at an episode's
start); ONNX names the outputs `<output>`, `h_next` (and `c_next`).

Beside the exported file go `<stem>.json` (observation shape and dtype, preprocessing, action space, what the
outputs mean) and `<stem>.safetensors` (the exported module's weights and normaliser statistics).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncrl.agents.appo.head import PolicyHead
from asyncrl.envs.base import MASK_KEY
from asyncrl.policy import LoadedRun, PolicyLoadError, load_run_policy

FORMATS = ("torchscript", "onnx")
ONNX_OPSET = 18


class ExportError(ValueError):
    """A run that cannot be exported; reported as one line with exit code 2."""


ExportedPolicy = PolicyHead  # APPO's exported module: raw observations -> logits or action means (with --rnn:
# RecurrentPolicyHead, (obs, *state) -> (logits or means, *next state))


def describe(run: LoadedRun, exported: dict[str, str]) -> dict[str, Any]:
    """The policy.json contents: how to feed the exported module and read its output."""
    spec = run.spec
    image = spec.has_image
    if spec.multi_discrete:
        action = {"type": "multi_discrete", "nvec": list(spec.nvec),
                  "start": [int(v) for v in spec.action_space.start]}
    elif spec.discrete:
        action = {"type": "discrete", "n": spec.num_actions}
    elif spec.is_tuple:
        action = {"type": "tuple", "shape": list(spec.action_shape),
                  "parts": [{"type": p.kind, "offset": p.offset, "width": p.width, "out_offset": p.out_offset,
                             "out_width": p.out_width,
                             **({"nvec": list(p.nvec), "start": [int(v) for v in np.atleast_1d(p.space.start)]}
                                if p.kind != "box" else {"low": _finite_list(p.space.low),
                                                         "high": _finite_list(p.space.high)})}
                            for p in spec.parts]}
    else:
        box = spec.action_space
        action = {"type": "box", "shape": list(spec.action_shape), "low": _finite_list(box.low),
                  "high": _finite_list(box.high)}
    head = run.head.describe()
    if spec.is_dict:
        inputs: dict[str, Any] = {
            "name": "obs", "type": "dict",
            "keys": [{"name": k.key, "shape": ["N", *k.shape], "dtype": np.dtype(k.dtype).name,
                      "meaning": "image, channels first" if k.image else
                      "allowed actions (1 = allowed): masks the logits" if k.key == MASK_KEY else "vector"}
                     for k in spec.obs_keys],
            "meaning": "a dict of raw observations, one tensor per key (TorchScript); ONNX takes one input per "
                       "key, named after it, in this order"}
    else:
        inputs = {"name": "obs", "shape": ["N", *spec.obs_shape], "dtype": np.dtype(spec.obs_dtype).name,
                  "meaning": "raw observations as the env returns them" + (
                      " (stacked grayscale frames, channels first)" if image else "")}
    described = {
        "env": spec.name, "algo": run.config.get("algo", "appo"), "checkpoint": run.checkpoint,
        "policy_version": run.version, "input": inputs,
        "preprocessing": head["preprocessing"], "action_space": action, "output": head["output"], "files": exported,
    }
    if head.get("state"):  # a recurrent policy: the state entries follow the observation in and the output out
        described["state"] = head["state"]
        described["call"] = ("(obs, " + ", ".join(e["name"] for e in head["state"]) + ") -> (" +
                             ", ".join([head["output"]["name"], *(e["name"] + "_next" for e in head["state"])]) +
                             "); ONNX names the outputs so; start every episode from zeros")
    return described


def _finite_list(values: Any) -> list[float | None]:
    """Bounds as strict JSON: an unbounded side (+-inf) becomes null."""
    return [float(v) if np.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).ravel()]


def export_policy(run_dir: str, fmt: str, out: str, best: bool = False, policy_index: int = 0) -> dict[str, str]:
    """Write the policy as `out` (TorchScript or ONNX) with `<stem>.json` and `<stem>.safetensors` beside it;
    from the newest good checkpoint, or with `best` from checkpoints/best.pt (`policy_index`: which policy of a
    --num-policies run)."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}")
    try:
        run = load_run_policy(run_dir, best=best, policy=policy_index)
    except PolicyLoadError as exc:
        raise ExportError(str(exc)) from None
    policy = run.head
    spec = run.spec
    example: Any = ({k.key: torch.from_numpy(np.zeros((2, *k.shape), dtype=k.dtype)) for k in spec.obs_keys}
                    if spec.is_dict else torch.from_numpy(np.zeros((2, *spec.obs_shape), dtype=spec.obs_dtype)))
    # A recurrent policy (--rnn) takes the state before the step after the observation and returns the state after
    # it after the policy output: forward(obs, *state) -> (output, *next state), in the core's order (h; h, c).
    state_keys = list(getattr(policy, "state_keys", ())) if policy.state_layout() else []
    state = [v for k, v in policy.initial_state(2).items() if k in state_keys]
    stem = os.path.splitext(out)[0]
    paths = {fmt: out, "json": stem + ".json", "safetensors": stem + ".safetensors"}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    outputs = [policy.output_name, *(f"{k}_next" for k in state_keys)]
    with torch.no_grad():
        if fmt == "torchscript":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated, still loadable
                torch.jit.save(torch.jit.trace(policy, (example, *state) if state else example), out)
        elif spec.is_dict or state:  # one named input per key (in the space's order), then the state's
            keys = list(example) if spec.is_dict else None
            inputs = (*(example.values() if spec.is_dict else (example,)), *state)
            _export_onnx(Positional(policy, keys), inputs, out, outputs, [*(keys or ["obs"]), *state_keys])
        else:
            _export_onnx(policy, (example,), out, outputs)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, paths["safetensors"],
              metadata={"env": run.spec.name, "checkpoint": run.checkpoint})
    files = {**_previous_files(paths["json"], run.checkpoint), **{k: os.path.basename(v) for k, v in paths.items()}}
    with open(paths["json"], "w") as f:
        json.dump(describe(run, files), f, indent=2)
    return paths


def _previous_files(json_path: str, checkpoint: str) -> dict[str, str]:
    """The files an earlier export of the same checkpoint listed (both formats may share one stem)."""
    try:
        with open(json_path) as f:
            previous = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    if previous.get("checkpoint") != checkpoint or not isinstance(previous.get("files"), dict):
        return {}
    stem_dir = os.path.dirname(json_path)
    return {k: v for k, v in previous["files"].items() if os.path.exists(os.path.join(stem_dir, v))}


class Positional(nn.Module):
    """A policy taking all its inputs positionally (ONNX inputs cannot be a dict): a Dict observation's keys one
    tensor each (`keys`; None: one observation tensor), then the recurrent state's entries, if any."""

    def __init__(self, policy: nn.Module, keys: list[str] | None):
        super().__init__()
        self.policy, self.keys = policy, keys

    def forward(self, *inputs: torch.Tensor) -> Any:
        if self.keys is None:
            return self.policy(inputs[0], *inputs[1:])
        n = len(self.keys)
        return self.policy(dict(zip(self.keys, inputs[:n], strict=True)), *inputs[n:])



def _export_onnx(policy: nn.Module, example: tuple[torch.Tensor, ...], out: str, output_names: list[str],
                 input_names: list[str] | None = None) -> None:
    """torch.export-based ONNX export with a dynamic batch dimension, written as one self-contained file."""
    import contextlib
    import io
    import logging

    logging.disable(logging.WARNING)  # the exporter logs every optional op it skips (e.g. torchvision's)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # the exporter's progress chatter and deprecation notes
            batch = torch.export.Dim("N")
            program = torch.onnx.export(policy, example, input_names=input_names or ["obs"],
                                        output_names=output_names,
                                        dynamic_shapes=_dynamic_batch(example, batch, input_names is not None),
                                        opset_version=ONNX_OPSET,
                                        dynamo=True, verbose=False)
    finally:
        logging.disable(logging.NOTSET)
    program.save(out, external_data=False)


def _dynamic_batch(example: tuple[torch.Tensor, ...], batch: Any, varargs: bool) -> tuple:
    """The first dimension of every input is the batch; the inputs of a *args forward are one tuple."""
    return (tuple({0: batch} for _ in example),) if varargs else ({0: batch},)
