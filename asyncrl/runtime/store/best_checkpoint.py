"""`checkpoints/best.pt`: the weights with the best greedy evaluation return so far (`--eval-every`).

Same layout as a training checkpoint where it matters (`learner.<key>`, `learner.version`, `config`, `env`, where
`<key>` is where the run's algo keeps its published policy: `model` for APPO, `actor` for SAC, TD3 and REDQ), so
`asyncrl-enjoy --best`, `asyncrl-export --best`, `asyncrl.load_policy(..., best=True)` and `torch.load` read it
like one; it holds only tensors, numbers and strings, so
`torch.load(..., weights_only=True)` opens it. Its name does not match `ckpt_*.pt`, so `--resume` never takes it
for the latest checkpoint and `--keep-checkpoints` never prunes it. Written atomically (temp file, fsync,
rename), so a kill mid-write leaves the previous best in place.
"""

from __future__ import annotations

import io
import os
from typing import Any

from asyncrl.config import Config
from asyncrl.runtime.store.checkpoint import checkpoint_dir

BEST_NAME = "best.pt"


def best_path(run_dir: str) -> str:
    return os.path.join(checkpoint_dir(run_dir), BEST_NAME)


def save_best(cfg: Config, model, version: int, frames: int, return_mean: float, return_std: float,
              path: str | None = None) -> str:
    """Write `model`'s weights (the published policy, as evaluated at policy `version`, `frames`) as best.pt (or
    at `path`: the evaluator stages it) under the key the run's algo checkpoints it under; return the path."""
    import torch

    from asyncrl.agents.registry import published_policy

    key = published_policy(cfg.algo).policy_state_key
    state: dict[str, Any] = {
        "learner": {key: {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                    "version": int(version)},
        "config": cfg.to_json(),
        "env": cfg.env,
        "eval": {"return_mean": float(return_mean), "return_std": float(return_std), "frames": int(frames),
                 "episodes": int(cfg.eval_episodes)},
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    path = path or best_path(cfg.run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load_best(run_dir: str, map_location: Any = "cpu") -> dict[str, Any]:
    """best.pt's contents (weights_only: no code runs on load); OSError/RuntimeError if missing or unreadable."""
    import torch

    return torch.load(best_path(run_dir), map_location=map_location, weights_only=True)


def read_best_return(run_dir: str) -> float | None:
    """The greedy return best.pt was saved with, or None when there is no readable best.pt."""
    if not os.path.exists(best_path(run_dir)):
        return None
    try:
        return float(load_best(run_dir)["eval"]["return_mean"])
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, EOFError):
        return None
