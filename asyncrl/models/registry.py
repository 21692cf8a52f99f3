"""Model parts by name: `--encoder` -> an encoder factory, `--rnn` -> a recurrent core, and the per-env state a
core carries. Torch-free: the runner imports it to check the flags and to size the slots' state columns.

Entries name their object as "module:attr" (resolved on use, like `asyncrl.agents.registry.LEARNERS`), so this
file loads no torch. Adding an encoder is one factory and one line in `ENCODERS`; adding a core is one class in
`asyncrl/models/cores.py`, one line in `CORES` and its state entries in `CORE_STATES`.

An encoder factory, built-in or a user's `--encoder module:callable`, is called as

    factory(obs_shape, hidden_size) -> torch.nn.Module

`obs_shape` is the observation's shape as the model sees it (images channels first, e.g. (4, 84, 84)), or for a
Dict observation a dict {key: shape} of the keys the encoder reads (the action mask is not one); `hidden_size`
is `--hidden-size`. The module maps a batch of raw observations ([N, *obs_shape] in the env's dtype: uint8
frames are not scaled; for a Dict observation a dict of such tensors) to float features [N, F]; F is read
from its output on a dummy batch when the model is built.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import numpy as np

from asyncrl.config import Config, ConfigError
from asyncrl.user_code import cwd_on_path

# name -> "module:factory"; the factories take (obs_shape, hidden_size) like a user's module:callable
ENCODERS: dict[str, str] = {
    "nature": "asyncrl.models.encoders:nature_cnn",  # Mnih et al. 2015 (images)
    "impala": "asyncrl.models.encoders:impala_cnn",  # Espeholt et al. 2018, the ResNet (images)
    "mlp": "asyncrl.models.encoders:mlp",  # two tanh layers of --hidden-size (vectors; images flattened)
}
IMAGE_ENCODERS = frozenset({"nature", "impala"})
AUTO = "auto"  # the Nature CNN for images, the MLP for vectors (and, in a Dict, per key)
CORES: dict[str, str] = {
    "gru": "asyncrl.models.cores:GRUCore",
    "lstm": "asyncrl.models.cores:LSTMCore",
}
CORE_STATES: dict[str, tuple[str, ...]] = {"gru": ("h",), "lstm": ("h", "c")}  # the per-env arrays of each core
NO_CORE = "none"

StateLayout = dict[str, tuple[tuple[int, ...], np.dtype]]


def state_layout(cfg: Config) -> StateLayout:
    """The per-env state the run's model carries (`asyncrl.agents.acting.Actor.state_layout`), from the settings
    alone: {} without --rnn; per entry of the core's state, ((rnn_layers, rnn_size), float32). The model's own
    `state_layout()` must agree (the policy worker checks it against the slots)."""
    return core_state_layout(cfg.rnn, cfg.rnn_size, cfg.rnn_layers)


def core_state_layout(rnn: str, size: int, layers: int) -> StateLayout:
    if rnn == NO_CORE:
        return {}
    return {k: ((int(layers), int(size)), np.dtype(np.float32)) for k in CORE_STATES[rnn]}


def is_user_encoder(name: str) -> bool:
    return ":" in name


def check_model(cfg: Config) -> None:
    """ConfigError (one line) for an unknown --rnn or --encoder, or a module:callable that names nothing
    importable. Whether a user encoder's output fits is checked once the env is known (`check_encoder_fits`)."""
    if cfg.rnn != NO_CORE and cfg.rnn not in CORES:
        raise ConfigError(f"--rnn must be none or one of {', '.join(CORES)} (got {cfg.rnn!r})")
    name = cfg.encoder
    if not is_user_encoder(name):
        if name != AUTO and name not in ENCODERS:
            raise ConfigError(f"--encoder must be auto, {', '.join(ENCODERS)} or module:callable (got {name!r})")
        return
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ConfigError(f"--encoder {name!r}: give a factory as module:callable, e.g. my_models:make_encoder")
    cwd_on_path()  # a my_models.py beside the user, as for --env
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # a parent package that is not there, or a malformed name
        raise ConfigError(f"--encoder {name!r}: cannot find module {module!r} ({exc})") from None
    if found is None:
        raise ConfigError(f"--encoder {name!r}: no module {module!r} on the Python path (PYTHONPATH)")


def check_encoder_env(cfg: Config, obs_shape: tuple[int, ...], has_image: bool, is_dict: bool) -> None:
    """ConfigError (one line) for a built-in image encoder on an env without images."""
    if cfg.encoder in IMAGE_ENCODERS and not has_image:
        shape = "a Dict observation without image keys" if is_dict else f"observations of shape {tuple(obs_shape)}"
        raise ConfigError(f"--encoder {cfg.encoder} takes image observations, but {cfg.env} has {shape}; use "
                          f"--encoder mlp (or auto)")


def resolve(ref: str) -> Any:
    """The object a "module:attr" entry (or a user's --encoder) names; ImportError / AttributeError if none."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
