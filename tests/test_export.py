"""asyncrl-export: TorchScript and ONNX files that reproduce the trained policy's outputs outside asyncrl."""

from __future__ import annotations

import json
import sys
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
from tests.custom_env import NoisyFrames

ROOT = Path(__file__).resolve().parents[1]

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


@pytest.mark.parametrize("env, normalize", [("Pendulum-v1", True), ("atari_pong", False), ("atari_pong", True)])
def test_continuous_and_frame_policies_export(tmp_path: Path, env: str, normalize: bool) -> None:
    """A checkpoint saved the way the learner saves one (untrained weights, shifted normaliser statistics)."""
    spec = make_env_spec(env)
    cfg = Config(env=env, normalize_obs=normalize, train_dir=str(tmp_path), experiment="run", workers=1)
    model = build_model(spec, cfg.hidden_size, cfg.normalize_obs)
    if normalize:
        if spec.obs_dtype == np.uint8:  # per-pixel statistics of frames: most pixels inside the +-5 clip
            model.obs_normalizer.update(torch.randint(0, 256, (200, *spec.obs_shape)).double())
        else:
            model.obs_normalizer.update(torch.randn(500, *spec.obs_shape, dtype=torch.float64) * 3 + 1)
        if not spec.discrete:
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
        # Frames are scaled by 1/255, or standardised per pixel instead with --normalize-obs
        assert info["output"]["name"] == "logits"
        assert [p["op"] for p in info["preprocessing"]] == ["normalize" if normalize else "scale"]
    else:
        assert info["output"]["name"] == "action_mean" and info["action_space"]["type"] == "box"
        assert info["output"]["log_std"] == pytest.approx([-0.5])


def test_frames_trained_with_per_pixel_normalisation_export_exactly(tmp_path: Path) -> None:
    """asyncrl-train --normalize-obs on a custom env's channels-last uint8 frames (uniform noise, but pixel
    (0, 0, c) always 10 + 50c): the checkpoint's statistics are per pixel of the channels-first frames the
    learner saw through shared memory, and the exported policy reproduces the trained one on raw frames."""
    sys.path.insert(0, str(ROOT))
    result = run_cli(["--env", "tests.custom_env:NoisyFrames", "--normalize-obs", "--frames", "1200",
                      "--workers", "1", "--envs-per-worker", "4", "--rollout", "8", "--batch-size", "32",
                      "--experiment", "frames"], tmp_path / "train", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "train" / "frames"
    _, state = load_latest_checkpoint(str(run_dir))
    mean, var = state["learner"]["model"]["obs_normalizer.mean"], state["learner"]["model"]["obs_normalizer.var"]
    assert mean.shape == (3, 40, 44)
    np.testing.assert_allclose(mean[:, 0, 0].numpy(), [10, 60, 110], atol=1e-2)  # the constant pixels, per channel
    assert float(var[:, 0, 0].max()) < 1.0
    noise = slice(1, None)  # uniform over 0..255: mean 127.5, variance (256^2 - 1) / 12 = 5461
    assert abs(float(mean[:, noise].mean()) - 127.5) < 1.0
    assert abs(float(var[:, noise].mean()) / 5461.25 - 1) < 0.03
    ts, onnx_path = export_both(run_dir, tmp_path / "out")
    env = NoisyFrames()
    frames = np.stack([np.moveaxis(env.reset(seed=s)[0], 2, 0) for s in range(3)])
    check_outputs(ts, onnx_path, frames, trained_outputs(run_dir, frames))
    info = json.loads((tmp_path / "out" / "policy.json").read_text())
    assert [p["op"] for p in info["preprocessing"]] == ["normalize"]


def test_missing_run_or_checkpoint_is_one_line_error(tmp_path: Path, capsys) -> None:
    assert export_main([str(tmp_path / "nope"), "--format", "onnx", "--out", str(tmp_path / "p.onnx")]) == 2
    (tmp_path / "empty").mkdir()
    assert export_main([str(tmp_path / "empty"), "--format", "torchscript", "--out", str(tmp_path / "p.pt")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"asyncrl-export: error: no run directory {tmp_path / 'nope'}"
    assert err[1].startswith("asyncrl-export: error: no usable checkpoint") and len(err) == 2
    assert not (tmp_path / "p.pt").exists()
