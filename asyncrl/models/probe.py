"""The model check that needs torch, run from the torch-free runner: the run's model is built on a dummy batch in
a forked child (`check_model_env`), so a user's `--encoder module:callable` that cannot be built, or whose output
does not fit, is refused in one line before anything is written. The name tables it reads are in `registry.py`."""

from __future__ import annotations

import os
from typing import Any

from asyncrl.config import Config, ConfigError
from asyncrl.models.registry import check_encoder_env, is_user_encoder


def check_model_env(cfg: Config, spec: Any, fork: bool = True) -> None:
    """Once the env is known (`spec`, an `EnvSpec`), before anything is written: ConfigError (one line) for a built-in
    image encoder on an env without images, or a user's --encoder that cannot be built or whose output does not
    fit. A user's module needs torch, which this (torch-free) process does not load: it is built on a dummy batch
    in a forked child, whose verdict comes back through a pipe; with `fork` False (--serial, which loads torch
    anyway) it is built in this process."""
    check_encoder_env(cfg, spec.obs_shape, spec.has_image, spec.is_dict)
    if not is_user_encoder(cfg.encoder):
        return
    if not fork:
        try:
            message = _build_model_here(cfg, spec)
        except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, one line
            message = f"--encoder {cfg.encoder}: building the model failed: {type(exc).__name__}: {exc}"
        if message:
            raise ConfigError(message.splitlines()[0])
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: build the model, write "" (it fits) or the one-line reason, exit at once
        message = ""
        try:
            os.close(read)
            message = _build_model_here(cfg, spec)
        except BaseException as exc:  # noqa: BLE001 - whatever happens, the parent gets one line
            message = f"--encoder {cfg.encoder}: building the model failed: {type(exc).__name__}: {exc}"
        finally:
            try:
                os.write(write, message.splitlines()[0].encode()[:2000] if message else b"")
            finally:
                os._exit(0)
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb") as pipe:
        while chunk := pipe.read(4096):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    message = b"".join(chunks).decode(errors="replace")
    if message:
        raise ConfigError(message)
    if not os.WIFEXITED(status):
        raise ConfigError(f"--encoder {cfg.encoder}: building the model on a dummy observation crashed (signal "
                          f"{os.WTERMSIG(status)})")


def _build_model_here(cfg: Config, spec: Any) -> str:
    """In the probe child: "" when the run's model builds (its encoder on a dummy batch), else the reason."""
    import torch

    from asyncrl.models.actor_critic import build_model
    from asyncrl.models.encoders import EncoderError

    torch.set_num_threads(1)
    try:
        build_model(spec, cfg.hidden_size, cfg.normalize_obs, cfg.encoder, cfg.rnn, cfg.rnn_size, cfg.rnn_layers,
                    cfg.activation)
    except EncoderError as exc:
        return str(exc)
    return ""
