"""Weights & Biases logging (`--wandb`): the TensorBoard scalars under the same namespaced tags, the config, and
evaluation videos, logged from the runner process. wandb is an optional extra (`pip install 'asyncrl[wandb]'`);
`WANDB_MODE=offline` keeps everything under `RUN_DIR/wandb/` for a later `wandb sync`. A resumed run continues
the same W&B run (its id is kept in `RUN_DIR/wandb_run_id`). Torch-free: it runs in the runner.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from asyncrl.config import Config, ConfigError
from asyncrl.system import install_hint

ID_FILE = "wandb_run_id"


class WandbLogger:
    """One W&B run per asyncrl run; a metrics sink for `MetricsWriter`."""

    def __init__(self, cfg: Config):
        try:
            import wandb
        except ImportError:
            raise ConfigError("--wandb needs the wandb package: " + install_hint("wandb")) from None
        self._wandb = wandb
        self.failed = False
        tags = [t.strip() for t in cfg.wandb_tags.split(",") if t.strip()]
        try:
            self.run = wandb.init(
                project=cfg.wandb_project, entity=cfg.wandb_entity or None, group=cfg.wandb_group or None,
                tags=tags or None, name=cfg.experiment_name, dir=cfg.run_dir, id=_run_id(cfg.run_dir),
                resume="allow", config=dataclasses.asdict(cfg), settings=wandb.Settings(console="off"))
            _keep_out_of_children()
        except Exception as exc:  # noqa: BLE001 - login, network or permission problems: one line for the user
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--wandb: cannot start a W&B run ({first}); run `wandb login` or set "
                              f"WANDB_MODE=offline") from None

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._guarded(lambda: self.run.log(scalars, step=step))

    def video(self, tag: str, path: str) -> None:
        """Attach an mp4 to the next logged step (steps must increase, and the video is of an earlier one)."""
        self._guarded(lambda: self.run.log({tag: self._wandb.Video(path, format="mp4")}, commit=False))

    def close(self) -> None:
        self._guarded(self.run.finish)

    def _guarded(self, call: Callable[[], object]) -> None:
        """W&B trouble never stops training: the first failure is reported and W&B logging ends there."""
        if self.failed:
            return
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - whatever wandb raises, metrics.jsonl and TensorBoard go on
            self.failed = True
            print(f"asyncrl: warning: W&B logging stopped ({type(exc).__name__}: {exc}); metrics.jsonl and "
                  f"TensorBoard go on", file=sys.stderr, flush=True)


def _keep_out_of_children() -> None:
    """The runner forks its workers after this: they must never talk to W&B. Console capture is off (a child's
    prints would go through wandb's stdout wrapper), and wandb's import hooks are dropped (a child's
    `import torch` would report telemetry on the parent's connection)."""
    from wandb.sdk.lib import import_hooks

    import_hooks.unregister_all_post_import_hooks()


def _run_id(run_dir: str) -> str:
    path = os.path.join(run_dir, ID_FILE)
    if os.path.exists(path):
        with open(path) as f:
            saved = f.read().strip()
        if saved:
            return saved
    run_id = uuid.uuid4().hex[:12]
    with open(path, "w") as f:
        f.write(run_id)
    return run_id


def open_sinks(cfg: Config) -> list[Any]:
    """The extra metrics sinks this run's flags ask for (W&B with --wandb)."""
    return [WandbLogger(cfg)] if cfg.wandb else []
