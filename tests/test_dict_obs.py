"""Dict observations: accepted and refused members, per-key slots and batches, the model, and a trained policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import asyncrl
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import gather_batch
from asyncrl.agents.registry import check_algo_env
from asyncrl.cli.enjoy import main as enjoy_main
from asyncrl.cli.export import main as export_main
from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import EnvError
from asyncrl.envs.gym_env import GymVecEnv, gym_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.policy import load_run_policy
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, obs_arrays
from asyncrl.runtime.stages.evaluation import _play
from asyncrl.runtime.stages.rollout import keep_final_obs
from asyncrl.runtime.store.checkpoint import save_checkpoint
from tests.conftest import run_cli
from tests.custom_env import SignMatch

ROOT = Path(__file__).resolve().parent.parent
BOX = gym.spaces.Box(-1.0, 1.0, (3,))


class _Spaces(gym.Env):
    def __init__(self, observation_space: gym.spaces.Space) -> None:
        self.observation_space, self.action_space = observation_space, gym.spaces.Discrete(2)


def test_dict_of_image_and_vector_is_described_per_key() -> None:
    spec = gym_env_spec("x", SignMatch())
    assert spec.is_dict and spec.has_image
    (cue, screen) = spec.obs_keys  # gymnasium sorts a plain dict's keys
    assert (screen.key, screen.shape, screen.dtype, screen.channels_last) == ("screen", (3, 36, 36), np.uint8, True)
    assert (cue.key, cue.shape, cue.dtype, cue.channels_last) == ("cue", (2,), np.float32, False)


@pytest.mark.parametrize(("member", "shown"), [
    (gym.spaces.Discrete(3), r"Discrete\(3\)"),
    (gym.spaces.Dict({"inner": BOX}), r"Dict\('inner'"),
    (gym.spaces.Text(4), r"Text\("),
    (gym.spaces.Box(-1.0, 1.0, (2, 2)), r"Box\(-1.0, 1.0, \(2, 2\)"),
])
def test_unsupported_dict_member_is_named_in_one_line(member: gym.spaces.Space, shown: str) -> None:
    with pytest.raises(EnvError, match=f"key 'bad' is {shown}") as info:
        gym_env_spec("x", _Spaces(gym.spaces.Dict({"ok": BOX, "bad": member})))
    assert "\n" not in str(info.value) and "supports" in str(info.value)


def test_slots_and_batch_hold_each_key_aligned_with_actions() -> None:
    """Real backend -> per-key slot arrays (written as the rollout worker does) -> gather_batch -> the model."""
    cfg = Config(env="tests.custom_env:SignMatch", workers=1, envs_per_worker=3, worker_splits=1, rollout=10,
                 batch_size=30, minibatches=1)
    cfg.validate()
    spec = gym_env_spec(cfg.env, SignMatch())
    traj = allocate_trajectories(cfg, spec)
    assert {"obs/screen", "obs/cue", "final_obs/screen", "final_obs/cue"} <= set(traj) and "obs" not in traj
    assert traj["obs/screen"].shape[1:] == (11, 3, 3, 36, 36) and traj["obs/screen"].dtype == np.uint8
    obs, final_obs = obs_arrays(traj, "obs"), obs_arrays(traj, "final_obs")
    env = GymVecEnv(cfg.env, SignMatch, 3)
    slot, scratch = 1, final_obs[0].zeros_like()
    env.reset(0, obs[slot, 0])
    rng = np.random.default_rng(0)
    for t in range(cfg.rollout):
        traj["actions"][slot, t] = rng.integers(0, 2, 3)
        env.step(traj["actions"][slot, t], obs[slot, t + 1], traj["rewards"][slot, t], traj["terminated"][slot, t],
                 traj["truncated"][slot, t], scratch)
        keep_final_obs(slot, t, traj["truncated"], scratch, final_obs, traj["final_step"])
    env.close()
    assert traj["final_step"][slot].tolist() == [7, 7, 7]  # 8-step episodes: cut after step 7
    assert (traj["final_obs/screen"][slot] == 5).all()  # brightness 5 + 10 * (step % 8), channels first

    batch = gather_batch(traj, np.array([slot]), version=0, device=torch.device("cpu"))
    assert set(batch.obs) == {"screen", "cue"} and set(batch.final_obs) == {"screen", "cue"}
    assert batch.obs["screen"].shape == (11, 3, 3, 36, 36) and batch.obs["cue"].shape == (11, 3, 2)
    # Each step's reward is 1 exactly where its action matched the sign of the cue it was taken on.
    matched = batch.actions == (batch.obs["cue"][:-1, :, 0] > 0).long()
    assert torch.equal(batch.rewards, matched.float())
    steps = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]  # the step of the episode, reset after step 7
    assert batch.obs["screen"][:, :, 0, 0, 0].tolist() == [[5 + 10 * s] * 3 for s in steps]
    assert (batch.final_step == 7).all() and (batch.final_obs["screen"] == 5).all()
    mb = batch.columns(slice(1, 3))
    assert torch.equal(mb.obs["cue"], batch.obs["cue"][:, 1:3]) and mb.final_obs["cue"].shape == (2, 2)

    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    stats = learner.train(batch, frames=0)
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["value_loss"])
    assert stats["truncations"] == 3 and stats["truncations_unbootstrapped"] == 0


@pytest.mark.parametrize("algo", ["sac", "td3", "redq"])
def test_replay_learners_refuse_dict_observations(algo: str) -> None:
    with pytest.raises(ConfigError, match=f"--algo {algo} takes vector observations, but .* has a Dict observation"):
        check_algo_env(Config(env="tests.custom_env:SignMatch", algo=algo), gym_env_spec("x", SignMatch()))


def test_normaliser_covers_every_key_frames_per_pixel() -> None:
    spec = gym_env_spec("x", SignMatch())
    model = build_model(spec, normalize_obs=True)
    assert set(model.obs_normalizer.keys()) == {"cue", "screen"} and model.frame_keys == {"screen"}
    assert model.encoder.encoders["screen"].input_scale == 1.0  # the CNN reads standardised pixels, no / 255
    screen = torch.full((6, 3, 36, 36), 7, dtype=torch.uint8)
    screen[:3, :, 5, 5] = 200  # one pixel lit in half the frames
    obs = {"screen": screen, "cue": torch.randn(6, 2) * 3 + 1}
    before = model._normalized(obs)["screen"]  # no statistics yet: the CNN's usual scaling
    torch.testing.assert_close(before, screen.float() / 255.0)
    model.update_obs_normalizer(obs, torch.ones(6, dtype=torch.bool))
    torch.testing.assert_close(model.obs_normalizer["cue"].mean.float(), obs["cue"].mean(0), atol=1e-3, rtol=0)
    normalized = model._normalized(obs)
    assert abs(float(normalized["cue"].mean())) < 0.1
    assert float(normalized["screen"][:, :, 0, 0].abs().max()) < 0.01  # a constant pixel reads about 0
    torch.testing.assert_close(normalized["screen"][:, 0, 5, 5], torch.tensor([1.0] * 3 + [-1.0] * 3), atol=1e-3,
                               rtol=0)
    assert obs["screen"].dtype == torch.uint8 and int(obs["screen"][0, 0, 5, 5]) == 200  # the input is untouched
    policy_out, value = model(obs)
    assert policy_out.shape == (6, 2) and value.shape == (6,)


@pytest.mark.parametrize("normalize_obs", [True, False])
def test_a_dict_batch_prepared_once_reads_as_prepared_per_call(normalize_obs: bool) -> None:
    """The learner's once-a-batch preparation of a Dict observation (the screen standardised or scaled by 1 / 255,
    in bf16; the cue normalised or left as it is) gives the per-call path's outputs exactly."""
    spec = gym_env_spec("x", SignMatch())
    torch.manual_seed(0)
    model = build_model(spec, normalize_obs=normalize_obs)
    model.compute_dtype = torch.bfloat16
    g = torch.Generator().manual_seed(1)
    obs = {"screen": torch.randint(0, 256, (6, 3, 36, 36), dtype=torch.uint8, generator=g),
           "cue": torch.randn(6, 2, generator=g) * 3 + 1}
    if normalize_obs:
        model.update_obs_normalizer(obs, torch.ones(6, dtype=torch.bool))
    prepared = model.prepare_input(obs)
    assert prepared["screen"].dtype == torch.bfloat16
    with torch.no_grad():
        logits, value = model(obs)
        with model.prepared_input():
            again, value_again = model(prepared)
    torch.testing.assert_close(again, logits, rtol=0, atol=0)
    torch.testing.assert_close(value_again, value, rtol=0, atol=0)
    assert model.encoder.encoders["screen"].input_scale == (1.0 if normalize_obs else 1.0 / 255.0)


def test_dict_env_trains_end_to_end_and_loads_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Every process and per-key shared memory; then load_policy, the evaluator's and asyncrl-enjoy's episodes."""
    sys.path.insert(0, str(ROOT))
    proc = run_cli(["--env", "tests.custom_env:SignMatch", "--frames", "4000", "--seed", "0", "--workers", "2",
                    "--envs-per-worker", "8", "--rollout", "8", "--batch-size", "128", "--epochs", "4",
                    "--minibatches", "2", "--lr", "1e-3", "--gamma", "0.9", "--normalize-obs", "--report-interval",
                    "1", "--experiment", "sign"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = tmp_path / "sign"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["policy_loss"] for r in records if r.get("policy_loss") is not None]
    assert losses and all(np.isfinite(losses)), losses
    returns = [r["episode_return_mean"] for r in records if r.get("episode_return_mean") is not None]
    assert returns[-1] >= 6.0, returns  # random: 4 of 8; held to the end of the budget, not only reached

    policy = asyncrl.load_policy(str(run_dir))
    cues = np.array([[0.8, 0.0], [-0.8, 0.0], [0.5, 0.3], [-0.6, -0.2]], np.float32)
    screens = np.zeros((4, 36, 36, 3), np.uint8)  # the env's own channels-last frames
    actions = policy({"screen": screens, "cue": cues})
    assert actions.tolist() == [1, 0, 1, 0]
    assert policy({"screen": screens[0], "cue": cues[0]}) == 1  # one observation, no batch dimension
    with pytest.raises(ValueError, match="keys"):
        policy({"cue": cues})

    run = load_run_policy(str(run_dir))
    played, _ = _play(run.model, Config.from_dict(run.config), run.spec, 2, True, lambda: True)
    assert [n for _, n in played] == [8, 8] and min(r for r, _ in played) >= 5.0, played
    assert enjoy_main([str(run_dir), "--episodes", "2", "--greedy"]) == 0
    assert "2 episodes: raw score mean" in capsys.readouterr().out


def test_dict_policy_exports_to_torchscript_and_onnx(tmp_path: Path) -> None:
    """A checkpoint of a dict-observation model (normaliser statistics set) -> both formats == load_policy."""
    cfg = Config(env="tests.custom_env:SignMatch", normalize_obs=True, train_dir=str(tmp_path), experiment="x")
    spec = gym_env_spec(cfg.env, SignMatch())
    model = build_model(spec, cfg.hidden_size, normalize_obs=True)
    norm = model.obs_normalizer["cue"]
    norm.mean.copy_(torch.tensor([0.5, -1.0]))
    norm.var.copy_(torch.tensor([0.04, 4.0]))
    model.obs_normalizer["screen"].mean.fill_(100.0)  # per pixel: 255 reads +3.1, 0 reads -2
    model.obs_normalizer["screen"].var.fill_(50.0**2)
    run_dir = str(tmp_path / "x")
    save_checkpoint(run_dir, 1, {"config": cfg.to_json(), "env": cfg.env,
                                 "learner": {"model": model.state_dict(), "version": 1}}, keep=1)
    policy = asyncrl.load_policy(run_dir)
    rng = np.random.default_rng(0)
    screens = rng.integers(0, 256, (5, 36, 36, 3), dtype=np.uint8)  # the env's own channels-last frames
    cues = rng.uniform(-2, 2, (5, 2)).astype(np.float32)  # some clipped by the normaliser
    chw = {"screen": torch.from_numpy(screens).permute(0, 3, 1, 2).contiguous(), "cue": torch.from_numpy(cues)}
    expected = policy.logits(chw).detach().numpy()
    with torch.no_grad():
        raw, _ = model.eval()(chw)
    np.testing.assert_allclose(expected, raw.numpy(), atol=1e-5, rtol=0)  # the trained model's own output
    assert policy({"screen": screens, "cue": cues}).tolist() == expected.argmax(-1).tolist()

    ts, onnx_path = tmp_path / "out" / "policy.pt", tmp_path / "out" / "policy.onnx"
    assert export_main([run_dir, "--format", "torchscript", "--out", str(ts)]) == 0
    np.testing.assert_allclose(torch.jit.load(str(ts))(chw).detach().numpy(), expected, atol=1e-5, rtol=0)
    info = json.loads((tmp_path / "out" / "policy.json").read_text())
    assert [(k["name"], k["shape"], k["dtype"]) for k in info["input"]["keys"]] == [
        ("cue", ["N", 2], "float32"), ("screen", ["N", 3, 36, 36], "uint8")]
    assert [p["op"] for p in info["preprocessing"]] == ["normalize"]  # frames standardised too, not scaled
    ort = pytest.importorskip("onnxruntime")
    assert export_main([run_dir, "--format", "onnx", "--out", str(onnx_path)]) == 0
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["cue", "screen"]
    (onnx_out,) = session.run(None, {k: v.numpy() for k, v in chw.items()})
    np.testing.assert_allclose(onnx_out, expected, atol=1e-5, rtol=0)
