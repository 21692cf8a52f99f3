"""Resuming an off-policy learner (--algo sac, td3, redq) restores every piece of its state.

A learner trains for a while and is saved as the learner process saves it (`save_checkpoint` of its
`state_dict()`); a fresh learner, built after the process-wide generators were moved on, loads the newest
checkpoint as `--resume` does (`load_latest_checkpoint`, `load_state_dict`). Every attribute of the learner
object is then compared, exactly, with its value at the save: networks and target networks, optimizers (moments
and step counts), the temperature and its optimizer, the counters, the replay sampling generator, and the
process's torch / numpy / Python generators. An attribute this file does not know fails the test, so state
added later has to be restored or listed below with the reason it need not be.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncrl.agents import registry
from asyncrl.agents.batch import Batch
from asyncrl.agents.off_policy.learner import OffPolicyLearner
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.store.checkpoint import load_latest_checkpoint, save_checkpoint

SPEC = make_env_spec("Pendulum-v1")
T, B = 4, 3
# What a resumed learner does not take from the checkpoint, and why.
NOT_RESTORED = {
    "cfg": "the run's settings: --resume builds the learner with the saved config",
    "spec": "the env's description, from the same config",
    "device": "where the learner runs, from the same config",
    "replay": "the replay buffer is not saved; a resumed run refills it",
    "buffer": "the replay buffer (as above)",
    "behaviour_logp": "per-transition data of the replay buffer (as above)",
    "held": "the replay buffer's fill level (as above)",
    "heartbeat": "a hook the learner process sets",
    "sync_gradients": "a hook the learner process sets",
    "agree_updates": "a hook the learner process sets",
    "return_normalizer": "None: the replay learners normalise no returns (a member of the Learner protocol)",
    "last_q_check": "this process's monotonic clock at the last Q-divergence check",
    "check_rng": "the Q-divergence check's draws: a diagnostic, training never reads them",
    "nonfinite_updates": "skipped updates counted by this process",
    "nonfinite_streak": "the stop rule's streak of skipped updates, per process",
    "_finite": "scratch flag of the update in progress",
    "last_actor_stats": "the last actor update's reported stats (shown until the next one)",
    "last_actor_loss": "the last actor update's reported loss (shown until the next one)",
}
ALIASES = {"model": ("actor", "critic"), "optimizer": ("critic_optimizer",), "extra_parameters": ("log_alpha",)}
# Derived from the config alone: equal in any learner built with it, so a fresh learner has them already.
FROM_CONFIG = {"action_dim", "q_check_window", "utd", "lr", "entropy_target", "compiled"}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as in the learner process on a loaded machine (many threads only contend here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_learner(algo: str) -> OffPolicyLearner:
    cfg = Config(env="Pendulum-v1", algo=algo, rollout=T, replay_size=1000, learning_starts=0, sac_batch_size=16,
                 hidden_size=32, utd=0.7).resolve()
    return registry.make_learner(cfg, SPEC, torch.device("cpu"))


def make_batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(obs=torch.randn(T + 1, B, 3, generator=g), actions=torch.rand(T, B, 1, generator=g) * 4 - 2,
                 behaviour_logp=torch.randn(T, B, generator=g), rewards=torch.randn(T, B, generator=g),
                 terminated=torch.rand(T, B, generator=g) < 0.2, truncated=torch.zeros(T, B, dtype=torch.bool),
                 final_obs=torch.zeros(B, 3), final_step=torch.full((B,), -1), lag=torch.zeros(T, B, dtype=torch.long),
                 valid=torch.ones(T, B, dtype=torch.bool))


def snapshot(learner: OffPolicyLearner) -> dict[str, Any]:
    """A copy of every attribute of the learner that a resume must restore."""
    out: dict[str, Any] = {}
    for name, value in vars(learner).items():
        if name in NOT_RESTORED:
            continue
        if name in ALIASES:
            parts = [getattr(learner, a) for a in ALIASES[name] if hasattr(learner, a)]
            inner = value.values() if isinstance(value, torch.nn.ModuleDict) else value
            held = list(inner) if isinstance(inner, (tuple, type({}.values()))) else [inner]
            assert all(any(h is p for p in parts) for h in held), f"{name} is no longer an alias of {ALIASES[name]}"
            continue
        if isinstance(value, torch.nn.Module):
            out[name] = {k: v.detach().clone() for k, v in value.state_dict().items()}
        elif isinstance(value, torch.optim.Optimizer):
            out[name] = _copy(value.state_dict())
        elif isinstance(value, torch.Tensor):
            out[name] = value.detach().clone()
        elif isinstance(value, np.random.Generator):
            out[name] = _copy(value.bit_generator.state)
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            pytest.fail(f"learner attribute {name} ({type(value).__name__}): restore it on resume, or say in "
                        f"NOT_RESTORED why it need not be")
    out["torch_rng"], out["numpy_rng"] = torch.get_rng_state(), _copy(np.random.get_state())
    out["python_rng"] = random.getstate()  # the process-wide generators, which the checkpoint keeps too
    return out


def _copy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    return x


def same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and \
            x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    return type(x) is type(y) and x == y


@pytest.mark.parametrize("algo", ["sac", "td3", "redq"])
def test_a_resumed_learner_has_every_piece_of_state_it_was_saved_with(algo: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    learner = make_learner(algo)
    for i in range(4):  # 4 x 12 steps at utd 0.7: 34 updates, 0.4 of one carried over
        learner.train(make_batch(i), 0)
    assert learner.updates > 0 and learner.update_credit != 0
    if algo != "td3":
        assert learner.entropy_alpha() != 1.0  # the temperature has moved from its start
    saved = snapshot(learner)
    save_checkpoint(str(tmp_path), learner.version, {"learner": learner.state_dict(), "env_steps": 48,
                                                     "config": learner.cfg.to_json(), "env": "Pendulum-v1"}, keep=1)

    torch.manual_seed(1234)  # a new process: other generator states, other initial weights
    np.random.seed(1234)
    random.seed(1234)
    resumed = make_learner(algo)
    fresh = snapshot(resumed)
    assert fresh.keys() == saved.keys()
    unchanged = sorted(k for k in saved if same(fresh[k], saved[k]))
    assert set(unchanged) <= FROM_CONFIG, f"a fresh learner already has {unchanged}: the test would prove nothing"

    _, state = load_latest_checkpoint(str(tmp_path))
    resumed.load_state_dict(state["learner"])
    restored = snapshot(resumed)
    wrong = [k for k in saved if not same(restored[k], saved[k])]
    assert not wrong, f"--resume did not restore {wrong}"
