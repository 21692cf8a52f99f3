"""asyncrl-export: TorchScript and ONNX files that reproduce the trained policy's outputs outside asyncrl."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file

from asyncrl.cli.export import main as export_main
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.runtime.store.checkpoint import load_latest_checkpoint, save_checkpoint
from tests.conftest import run_cli

TOL = 1e-5


def trained_outputs(run_dir: Path, obs: np.ndarray) -> np.ndarray:
    """The policy head's output of the run's model, rebuilt from its checkpoint the way asyncrl does."""
    _, state = load_latest_checkpoint(str(run_dir))
    cfg = Config.from_dict(json.loads(state["config"]))
    model = build_model(make_env_spec(cfg.env), cfg.hidden_size, cfg.normalize_obs)
    model.load_state_dict(state["learner"]["model"])
    with torch.no_grad():
        return model.eval()(torch.from_numpy(obs))[0].numpy()


def export_both(run_dir: Path, out: Path) -> tuple[Path, Path]:
    ts, onnx_path = out / "policy.pt", out / "policy.onnx"
    assert export_main([str(run_dir), "--format", "torchscript", "--out", str(ts)]) == 0
    assert export_main([str(run_dir), "--format", "onnx", "--out", str(onnx_path)]) == 0
    return ts, onnx_path


def check_outputs(ts: Path, onnx_path: Path, obs: np.ndarray, expected: np.ndarray) -> None:
    scripted = torch.jit.load(str(ts))
    np.testing.assert_allclose(scripted(torch.from_numpy(obs)).detach().numpy(), expected, atol=TOL, rtol=0)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {"obs": obs})
    np.testing.assert_allclose(onnx_out, expected, atol=TOL, rtol=0)


def test_trained_cartpole_policy_with_normaliser_exports_exactly(tmp_path: Path) -> None:
    result = run_cli(["--env", "CartPole-v1", "--frames", "3000", "--normalize-obs", "--workers", "2",
                      "--experiment", "cp"], tmp_path / "train", timeout=300)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "train" / "cp"
    ts, onnx_path = export_both(run_dir, tmp_path / "out")
    obs = (np.random.default_rng(0).standard_normal((7, 4)) * 2).astype(np.float32)  # some clipped by the normaliser
    expected = trained_outputs(run_dir, obs)
    check_outputs(ts, onnx_path, obs, expected)
    info = json.loads((tmp_path / "out" / "policy.json").read_text())
    assert info["input"] == {"name": "obs", "shape": ["N", 4], "dtype": "float32",
                             "meaning": "raw observations as the env returns them"}
    assert info["action_space"] == {"type": "discrete", "n": 2} and info["output"]["name"] == "logits"
    assert [p["op"] for p in info["preprocessing"]] == ["normalize"]
    assert info["files"] == {"torchscript": "policy.pt", "onnx": "policy.onnx", "json": "policy.json",
                             "safetensors": "policy.safetensors"}
    weights = load_file(str(tmp_path / "out" / "policy.safetensors"))
    _, state = load_latest_checkpoint(str(run_dir))
    model_state = state["learner"]["model"]
    assert torch.equal(weights["policy_head.weight"], model_state["policy_head.weight"])
    assert torch.equal(weights["obs_mean"], model_state["obs_normalizer.mean"].float())


@pytest.mark.parametrize("env, normalize", [("Pendulum-v1", True), ("atari_pong", False)])
def test_continuous_and_frame_policies_export(tmp_path: Path, env: str, normalize: bool) -> None:
    """A checkpoint saved the way the learner saves one (untrained weights, shifted normaliser statistics)."""
    spec = make_env_spec(env)
    cfg = Config(env=env, normalize_obs=normalize, train_dir=str(tmp_path), experiment="run", workers=1)
    model = build_model(spec, cfg.hidden_size, cfg.normalize_obs)
    if normalize:
        model.obs_normalizer.update(torch.randn(500, *spec.obs_shape, dtype=torch.float64) * 3 + 1)
        with torch.no_grad():
            model.log_std.fill_(-0.5)
    save_checkpoint(cfg.run_dir, 7, {"learner": {"model": model.state_dict(), "version": 7}, "env_steps": 0,
                                     "config": cfg.to_json(), "env": env}, keep=1)
    ts, onnx_path = export_both(Path(cfg.run_dir), tmp_path / "out")
    rng = np.random.default_rng(1)
    if spec.obs_dtype == np.uint8:
        obs = rng.integers(0, 256, (3, *spec.obs_shape), dtype=np.uint8)
    else:
        obs = (rng.standard_normal((5, *spec.obs_shape)) * 4).astype(np.float32)
    check_outputs(ts, onnx_path, obs, trained_outputs(Path(cfg.run_dir), obs))
    info = json.loads((tmp_path / "out" / "policy.json").read_text())
    assert info["input"]["dtype"] == np.dtype(spec.obs_dtype).name
    if spec.discrete:
        assert info["output"]["name"] == "logits" and [p["op"] for p in info["preprocessing"]] == ["scale"]
    else:
        assert info["output"]["name"] == "action_mean" and info["action_space"]["type"] == "box"
        assert info["output"]["log_std"] == pytest.approx([-0.5])


def test_missing_run_or_checkpoint_is_one_line_error(tmp_path: Path, capsys) -> None:
    assert export_main([str(tmp_path / "nope"), "--format", "onnx", "--out", str(tmp_path / "p.onnx")]) == 2
    (tmp_path / "empty").mkdir()
    assert export_main([str(tmp_path / "empty"), "--format", "torchscript", "--out", str(tmp_path / "p.pt")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"asyncrl-export: error: no run directory {tmp_path / 'nope'}"
    assert err[1].startswith("asyncrl-export: error: no usable checkpoint") and len(err) == 2
    assert not (tmp_path / "p.pt").exists()
