"""Off-policy checkpoints (--algo sac, td3, redq) in everything that reads a run's checkpoint: asyncrl.load_policy,
asyncrl-export (TorchScript, ONNX), asyncrl-enjoy and checkpoints/best.pt. One short Pendulum run with --eval-every
per family (SAC, TD3) through the real processes; REDQ in process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file

import asyncrl
from asyncrl.cli import enjoy
from asyncrl.cli.export import main as export_main
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.learners import registry
from asyncrl.learners.off_policy import OffPolicyActor
from asyncrl.runtime.best_checkpoint import best_path, load_best
from asyncrl.runtime.checkpoint import load_latest_checkpoint, save_checkpoint
from tests.conftest import read_metrics, run_cli

TOL = 1e-5
SPEC = make_env_spec("Pendulum-v1")
FLAGS = ["--env", "Pendulum-v1", "--frames", "1200", "--learning-starts", "400", "--hidden-size", "32",
         "--eval-every", "600", "--eval-episodes", "1", "--report-interval", "1"]


@pytest.fixture(scope="module", params=["sac", "td3"])
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    train_dir = tmp_path_factory.mktemp(request.param)
    done = run_cli([*FLAGS, "--algo", request.param, "--experiment", "x"], train_dir, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return train_dir / "x"


def observations(n: int = 64, seed: int = 0) -> np.ndarray:
    """Pendulum observations (cos, sin, angular velocity), some beyond the ranges the env produces."""
    return (np.random.default_rng(seed).standard_normal((n, 3)) * [1.0, 1.0, 8.0]).astype(np.float32)


def published_actor(state: dict) -> OffPolicyActor:
    """The actor the learner publishes, restored by the learner itself from the checkpoint's full state."""
    cfg = Config.from_dict({**json.loads(state["config"]), "replay_size": 1000})
    learner = registry.make_learner(cfg, SPEC, torch.device("cpu"))
    learner.load_state_dict(state["learner"])
    return learner.policy_module().eval()


def test_load_policy_acts_as_the_published_actor(run_dir: Path) -> None:
    policy = asyncrl.load_policy(str(run_dir))
    path, state = load_latest_checkpoint(str(run_dir))
    actor = published_actor(state)
    assert float(actor.warmup) == 0.0 and policy.checkpoint == path and policy.version == state["learner"]["version"]
    obs = observations()
    with torch.no_grad():
        greedy, _ = actor(torch.from_numpy(obs))
    actions = policy(obs)
    assert isinstance(actions, np.ndarray) and actions.shape == (64, 1) and np.abs(actions).max() <= 2.0
    np.testing.assert_allclose(actions, greedy.numpy(), atol=1e-6, rtol=0)
    assert policy(obs[5]).shape == (1,)
    # Sampled actions are the policy workers': the same draws as the published actor's act() under one seed.
    torch.manual_seed(3)
    sampled = policy(torch.from_numpy(obs), sample=True)
    torch.manual_seed(3)
    expected, _ = actor.act(torch.from_numpy(obs))
    torch.testing.assert_close(sampled, expected, atol=0, rtol=0)
    assert sampled.abs().max() <= 2.0 and not torch.allclose(sampled, greedy)


def test_export_round_trip_matches_the_loaded_policy(run_dir: Path, tmp_path: Path) -> None:
    ts, onnx_path = tmp_path / "p.pt", tmp_path / "p.onnx"
    assert export_main([str(run_dir), "--format", "torchscript", "--out", str(ts)]) == 0
    assert export_main([str(run_dir), "--format", "onnx", "--out", str(onnx_path)]) == 0
    obs = observations(9, seed=1)
    expected = asyncrl.load_policy(str(run_dir))(obs)
    np.testing.assert_allclose(torch.jit.load(str(ts))(torch.from_numpy(obs)).detach().numpy(), expected, atol=TOL,
                               rtol=0)
    (onnx_out,) = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})
    np.testing.assert_allclose(onnx_out, expected, atol=TOL, rtol=0)
    info = json.loads((tmp_path / "p.json").read_text())
    _, state = load_latest_checkpoint(str(run_dir))
    assert info["algo"] == json.loads(state["config"])["algo"] and info["preprocessing"] == []
    assert info["action_space"] == {"type": "box", "shape": [1], "low": [-2.0], "high": [2.0]}
    assert info["output"]["name"] == "action" and info["output"]["shape"] == ["N", 1]
    weights = load_file(str(tmp_path / "p.safetensors"))
    assert torch.equal(weights["actor.net.mean.weight"], state["learner"]["actor"]["net.mean.weight"])


@pytest.mark.parametrize("greedy", [True, False])
def test_enjoy_plays_a_pendulum_episode(run_dir: Path, greedy: bool, capsys: pytest.CaptureFixture[str]) -> None:
    assert enjoy.main([str(run_dir), "--episodes", "1", *(["--greedy"] if greedy else [])]) == 0
    out = capsys.readouterr().out
    assert "episode 1: score " in out and "(200 steps)" in out, out
    score = float(out.split("episode 1: score ")[1].split()[0])
    assert -2000 < score <= 0, out


def test_best_checkpoint_loads_through_load_policy(run_dir: Path) -> None:
    evals = [r["eval_return_mean"] for r in read_metrics(run_dir) if "eval_return_mean" in r]
    assert evals and np.isfinite(evals).all()
    state = load_best(str(run_dir))
    assert state["eval"]["return_mean"] == pytest.approx(max(evals))
    policy = asyncrl.load_policy(str(run_dir), best=True)
    assert policy.checkpoint == best_path(str(run_dir)) and policy.version == state["learner"]["version"]
    actor = OffPolicyActor(SPEC, 32).eval()
    actor.load_state_dict(state["learner"]["actor"])  # best.pt keeps the actor where a training checkpoint does
    obs = observations(16, seed=2)
    with torch.no_grad():
        np.testing.assert_allclose(policy(obs), actor(torch.from_numpy(obs))[0].numpy(), atol=1e-6, rtol=0)


def test_redq_checkpoint_loads_and_a_missing_best_is_one_line(tmp_path: Path) -> None:
    cfg = Config(env="Pendulum-v1", algo="redq", hidden_size=32, replay_size=1000, train_dir=str(tmp_path),
                 experiment="r").resolve()
    learner = registry.make_learner(cfg, SPEC, torch.device("cpu"))
    with torch.no_grad():
        learner.actor.net.mean.bias.fill_(0.5)  # not the initial weights
    save_checkpoint(cfg.run_dir, 3, {"learner": learner.state_dict(), "env_steps": 0, "config": cfg.to_json(),
                                     "env": cfg.env}, keep=1)
    obs = observations(8, seed=3)
    with torch.no_grad():
        expected, _ = learner.policy_module()(torch.from_numpy(obs))
    np.testing.assert_allclose(asyncrl.load_policy(cfg.run_dir)(obs), expected.numpy(), atol=1e-6, rtol=0)
    with pytest.raises(asyncrl.PolicyLoadError, match="written by a run trained with --eval-every") as err:
        asyncrl.load_policy(cfg.run_dir, best=True)
    assert "\n" not in str(err.value)
