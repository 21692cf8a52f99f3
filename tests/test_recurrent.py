"""Recurrent policies (`--rnn gru|lstm`) and the model API (`--encoder`): the flags and their refusals, the acting
contract with a state, the learner's unroll against stepping one at a time, the IMPALA encoder, and short real
runs whose checkpoints load, play and export with the state as an input and an output."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from asyncrl.agents.acting import Actor, published_actor
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import Batch
from asyncrl.cli.enjoy import main as enjoy_main
from asyncrl.cli.export import main as export_main
from asyncrl.cli.train import main as train_main
from asyncrl.config import Config, ConfigError
from asyncrl.envs.base import MASK_KEY, EnvSpec, ObsKey
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import ActorCritic, RecurrentActorCritic, build_model
from asyncrl.models.encoders import ImpalaCNN, NatureCNN
from asyncrl.models.registry import state_layout
from asyncrl.policy import RecurrentPolicy, load_policy
from asyncrl.runtime.plumbing.trajectories import num_slots, trajectory_bytes, trajectory_layout
from asyncrl.runtime.roles import runner
from asyncrl.runtime.store.run_meta import check_resume, write_meta
from tests import launcher
from tests.conftest import read_metrics

TESTS = os.path.dirname(os.path.abspath(__file__))
F32 = np.dtype(np.float32)
VECTOR = EnvSpec("v", (4,), F32, gym.spaces.Discrete(3), 1)
MASKED = EnvSpec("m", (), F32, gym.spaces.Discrete(4), 1,
                 obs_keys=(ObsKey("state", (4,), F32), ObsKey(MASK_KEY, (4,), F32)))
TOL = 1e-5  # absolute and relative: exported graphs round each float32 op their own way (LSTM cells reach ~20)


def _cfg(rnn: str, **kw) -> Config:
    return Config(env="CartPole-v1", rnn=rnn, rnn_size=16, rnn_layers=2, **kw)


def _obs(spec: EnvSpec, *lead: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if not spec.is_dict:
        return torch.randn(*lead, *spec.obs_shape, generator=g)
    mask = (torch.rand(*lead, 4, generator=g) < 0.5).float()
    mask[..., 0] = 1.0
    return {"state": torch.randn(*lead, 4, generator=g), MASK_KEY: mask}


# ----- flags -----

@pytest.mark.parametrize("args, message", [
    (["--rnn-size", "0"], "--rnn-size must be at least 1 (got 0)"),
    (["--rnn", "gru", "--rnn-layers", "0"], "--rnn-layers must be at least 1 (got 0)"),
    (["--rnn", "transformer"], "--rnn must be none or one of gru, lstm (got 'transformer')"),
    (["--encoder", "resnet"], "--encoder must be auto, nature, impala, mlp or module:callable (got 'resnet')"),
    (["--encoder", "no_such_module_here:make"], "no module 'no_such_module_here' on the Python path"),
    (["--algo", "sac", "--env", "Pendulum-v1", "--rnn", "gru"], "--rnn applies to --algo appo only, not sac"),
    (["--algo", "td3", "--env", "Pendulum-v1", "--encoder", "mlp"], "--encoder applies to --algo appo only"),
])
def test_bad_model_flags_are_one_line_errors(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    code = train_main(["--env", "CartPole-v1", *args, "--train-dir", str(tmp_path), "--experiment", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("encoder, message", [
    ("impala", "--encoder impala takes image observations, but CartPole-v1 has observations of shape (4,)"),
    ("recurrent_models:sequence_encoder", "it must return float features of shape [2, F]"),
    ("recurrent_models:broken_encoder", "RuntimeError: no encoder for you"),
    ("recurrent_models:not_a_factory", "is not callable"),
])
def test_an_encoder_that_does_not_fit_the_env_is_refused_before_anything_is_written(
        tmp_path: Path, encoder: str, message: str) -> None:
    """Checked once the env is known; a user's module is built on a dummy batch, in a child that may import torch
    (the runner stays torch-free)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    proc = launcher.run("train", ["--env", "CartPole-v1", "--encoder", encoder, "--train-dir", str(tmp_path),
                                  "--experiment", "x"], timeout=120, env=env)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_default_model_is_feed_forward_and_its_slots_have_no_state() -> None:
    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=8, rollout=16, batch_size=256)
    assert (cfg.rnn, cfg.encoder, cfg.rnn_size, cfg.rnn_layers) == ("none", "auto", 512, 1)
    assert state_layout(cfg) == {}
    spec = make_env_spec("CartPole-v1")
    assert not any(k.startswith("state/") for k in trajectory_layout(cfg, spec, state_layout(cfg)))
    model = APPOLearner.build_policy(spec, cfg, torch.device("cpu"))
    assert type(model) is ActorCritic and not isinstance(model, Actor)  # acts through PublishedActor, as before
    assert published_actor(model).state_layout() == {}
    torch.manual_seed(0)
    a = build_model(spec, 64)
    torch.manual_seed(0)
    b = ActorCritic(spec, 64)  # the default encoder choice builds the same modules in the same order
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_state_columns_are_sized_from_the_settings_and_counted_in_the_memory_check(monkeypatch) -> None:
    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=8, rollout=16, batch_size=256, rnn="lstm",
                 rnn_size=512, rnn_layers=2)
    spec = make_env_spec("CartPole-v1")
    layout = trajectory_layout(cfg, spec, state_layout(cfg))
    s, t, e = num_slots(cfg), cfg.rollout, cfg.envs_per_split
    assert layout["state/h"] == layout["state/c"] == ((s, t + 1, e, 2, 512), F32)
    plain, with_state = trajectory_bytes(cfg, spec), trajectory_bytes(cfg, spec, state_layout(cfg))
    assert with_state - plain >= 2 * s * (t + 1) * e * 2 * 512 * 4
    monkeypatch.setattr(runner, "available_memory", lambda: int(with_state / 0.8) - 1)
    with pytest.raises(ConfigError, match="the trajectory buffers need"):
        runner.check_memory(cfg, spec)
    runner.check_memory(Config(**{**cfg.__dict__, "rnn": "none"}), spec)


@pytest.mark.parametrize("rnn, gate", [("gru", 1), ("lstm", 1)])  # torch's gate order: GRU r, z, n; LSTM i, f, g, o
def test_the_keeping_gates_start_open(rnn: str, gate: int) -> None:
    """The GRU's update gates and the LSTM's forget gates start at bias 1 (the sum of both bias vectors), the
    rest at torch's initialisation: at 0 a core keeps half its state per step, and tests/test_memory.py's cue task
    took 2-4x the env steps to learn (measured there)."""
    from asyncrl.models.cores import build_core

    torch.manual_seed(0)
    core = build_core(rnn, 8, 16, 2)
    for layer in range(2):
        total = getattr(core.rnn, f"bias_ih_l{layer}") + getattr(core.rnn, f"bias_hh_l{layer}")
        keep = total[gate * 16:(gate + 1) * 16]
        rest = torch.cat([total[:gate * 16], total[(gate + 1) * 16:]])
        assert torch.equal(keep, torch.ones(16)), keep
        assert rest.abs().max() < 2 / 16 ** 0.5 and rest.std() > 0  # torch's uniform(-1/sqrt(size), 1/sqrt(size)) twice


# ----- the acting contract with a state -----

@pytest.mark.parametrize("rnn, keys", [("gru", ["h"]), ("lstm", ["h", "c"])])
@pytest.mark.parametrize("spec", [VECTOR, MASKED], ids=["vector", "dict_masked"])
def test_state_layout_and_act_shapes(rnn: str, keys: list[str], spec: EnvSpec) -> None:
    cfg = _cfg(rnn)
    model = APPOLearner.build_policy(spec, cfg, torch.device("cpu"))
    assert isinstance(model, RecurrentActorCritic) and published_actor(model) is model
    layout = model.state_layout()
    assert layout == state_layout(cfg) == {k: ((2, 16), F32) for k in keys}  # the torch-free twin agrees
    n = 6
    state = model.initial_state(n)
    assert list(state) == keys and all(v.shape == (n, 2, 16) and not v.any() for v in state.values())
    obs = _obs(spec, n)
    actions, logp, after = model.act(obs, state, torch.ones(n, dtype=torch.bool))
    assert actions.shape == (n,) and logp.shape == (n,) and list(after) == keys
    assert all(v.shape == (n, 2, 16) and v.abs().sum() > 0 for v in after.values())
    if spec.masked:
        assert bool(torch.gather(obs[MASK_KEY], 1, actions.unsqueeze(1)).all())
    # `first` resets: a noisy state behaves as zeros where first is set, and as itself elsewhere
    noisy = {k: torch.randn_like(v) for k, v in state.items()}
    first = torch.tensor([True, False] * (n // 2))
    _, greedy_logp, reset_after = model.act(obs, noisy, first, greedy=True)
    _, zero_logp, zero_after = model.act(obs, state, None, greedy=True)
    for k in keys:
        torch.testing.assert_close(reset_after[k][first], zero_after[k][first])
        assert not torch.allclose(reset_after[k][~first], zero_after[k][~first])
    torch.testing.assert_close(greedy_logp[first], zero_logp[first])
    head = APPOLearner.policy_head(model, spec)  # load_policy, enjoy and export: the same state
    assert head.state_layout() == layout and isinstance(head, Actor)
    _, _, head_after = head.act(obs, noisy, first, greedy=True)
    for k in keys:
        torch.testing.assert_close(head_after[k], reset_after[k])


# ----- the learner -----

def _batch(spec: EnvSpec, model: RecurrentActorCritic, t: int = 7, b: int = 4) -> Batch:
    """A batch whose trajectories hold episode starts after step 0 (env 0 at 3, env 2 at 1 and 5), a bootstrapped
    truncation (env 1 after step 4, so its episode restarts at 5) and a non-zero initial state."""
    g = torch.Generator().manual_seed(2)
    terminated, truncated = torch.zeros(t, b, dtype=torch.bool), torch.zeros(t, b, dtype=torch.bool)
    terminated[2, 0] = terminated[0, 2] = terminated[4, 2] = True
    truncated[4, 1] = True
    first = torch.cat([torch.tensor([[True, False, False, False]]), terminated | truncated])
    obs = _obs(spec, t + 1, b, seed=3)
    actions = torch.zeros(t, b, dtype=torch.int64) if spec.masked else torch.randint(0, 3, (t, b), generator=g)
    return Batch(obs=obs, actions=actions, behaviour_logp=-torch.rand(t, b, generator=g),
                 rewards=torch.randn(t, b, generator=g), terminated=terminated, truncated=truncated,
                 final_obs=_obs(spec, b, seed=4), final_step=torch.tensor([-1, 4, -1, -1]),
                 lag=torch.zeros(t, b, dtype=torch.int64), valid=torch.ones(t, b, dtype=torch.bool), first=first,
                 initial_state={k: torch.randn(b, *shape, generator=g)
                                for k, (shape, _) in model.state_layout().items()})


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("spec", [VECTOR, MASKED], ids=["vector", "dict_masked"])
def test_the_learners_unroll_equals_stepping_the_core_one_step_at_a_time(rnn: str, spec: EnvSpec) -> None:
    torch.manual_seed(0)
    learner = APPOLearner(_cfg(rnn, epochs=2, minibatches=2), spec, torch.device("cpu"))
    model = learner.model
    batch = _batch(spec, model)
    t, b = batch.rewards.shape
    policy_out, values, before = learner._unroll(batch)
    # The same trajectories acted one step at a time, as the policy workers act (resetting where `first`)
    state, outs, step_values, after_truncation = dict(batch.initial_state), [], [], None
    with torch.no_grad():
        for step in range(t + 1):
            obs_t = {k: v[step] for k, v in batch.obs.items()} if spec.is_dict else batch.obs[step]
            out, value, state = model.step(obs_t, state, batch.first[step])
            outs.append(out)
            step_values.append(value)
            if step == 4:  # env 1 is truncated after step 4: its final observation's value needs this state
                after_truncation = {k: v[1:2] for k, v in state.items()}
        final_obs = {k: v[1:2] for k, v in batch.final_obs.items()} if spec.is_dict else batch.final_obs[1:2]
        _, final_value, _ = model.step(final_obs, after_truncation, None)
    torch.testing.assert_close(policy_out.detach(), torch.stack(outs).flatten(0, 1), atol=TOL, rtol=0)
    torch.testing.assert_close(values.detach(), torch.stack(step_values), atol=TOL, rtol=0)
    dist = model.distribution(policy_out[: t * b])
    want = model.distribution(torch.stack(outs)[:t].flatten(0, 1))
    actions = batch.actions.reshape(-1)
    torch.testing.assert_close(dist.log_prob(actions).detach(), want.log_prob(actions), atol=TOL, rtol=0)
    finals = learner._final_values_recurrent(batch, before)
    assert finals[4, 1] == pytest.approx(float(final_value[0]), abs=TOL) and finals.abs().sum() == finals[4, 1].abs()
    # backpropagation through the whole trajectory: the last value of env 3 (no reset) depends on its first obs
    obs = batch.obs["state"] if spec.is_dict else batch.obs
    obs.requires_grad_(True)
    _, v, _ = model.unroll(batch.obs, batch.first, batch.initial_state)
    (v[t, 3] + v[t, 0]).backward()
    assert obs.grad[0, 3].abs().sum() > 0 and obs.grad[3, 0].abs().sum() > 0
    assert obs.grad[2, 0].abs().sum() == 0  # env 0 restarts at step 3: nothing before it reaches its last value
    obs.requires_grad_(False)
    if rnn == "lstm":  # cells that have run away (|c| > 10) are counted in the batch's stored states
        batch.initial_state["c"][:, :, :8] = -12.0
        batch.initial_state["c"][:, :, 8:] = 0.5
    stats = learner.train(batch, frames=0)  # epochs x minibatches of whole trajectories (env columns)
    assert learner.version == 1 and all(math.isfinite(stats[k]) for k in ("policy_loss", "value_loss", "grad_norm"))
    if rnn == "lstm":
        assert "core_saturation" in learner.stat_names and stats["core_saturation"] == 0.5  # 8 of the 16 units
    else:  # a GRU's state is bounded by its gates: nothing to count
        assert "core_saturation" not in learner.stat_names and "core_saturation" not in stats


def test_check_resume_refuses_another_core(tmp_path: Path) -> None:
    spec = make_env_spec("CartPole-v1")
    saved = Config(env="CartPole-v1", train_dir=str(tmp_path), experiment="r", rnn="gru", rnn_size=64)
    write_meta(saved, spec)
    check_resume(saved, spec)
    for change, flag in ((dict(rnn="none"), "--rnn gru"), (dict(rnn_size=32), "--rnn-size 64"),
                         (dict(rnn="lstm"), "--rnn gru"), (dict(encoder="mlp"), "--encoder auto")):
        resumed = Config(**{**saved.__dict__, **change})
        with pytest.raises(ConfigError, match=flag):
            check_resume(resumed, spec)


# ----- encoders -----

def test_impala_encoder_on_stacked_frames() -> None:
    encoder = ImpalaCNN(4, 84, 84)
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert encoder(frames).shape == (3, 256) and encoder.out_features == 256
    convs = [m for m in encoder.conv if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 32]
    spec = EnvSpec("atari", (4, 84, 84), np.dtype(np.uint8), gym.spaces.Discrete(6), 4)
    for rnn in ("none", "gru"):
        model = build_model(spec, encoder="impala", rnn=rnn, rnn_size=32)
        assert isinstance(model.encoder, ImpalaCNN)
        out, value = model(frames)
        assert out.shape == (3, 6) and value.shape == (3,)
    assert isinstance(build_model(spec).encoder, NatureCNN)


def test_a_user_encoder_builds_from_module_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(TESTS)
    model = build_model(VECTOR, encoder="recurrent_models:small_encoder", rnn="lstm", rnn_size=8)
    assert model.encoder.out_features == 32 and model.value_encoder is None
    actions, _, state = model.act(_obs(VECTOR, 5), model.initial_state(5), torch.ones(5, dtype=torch.bool))
    assert actions.shape == (5,) and state["c"].shape == (5, 1, 8)


# ----- real runs -----

SMALL = ["--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "4", "--batch-size", "128",
         "--report-interval", "1", "--device", "cpu", "--rnn-size", "32"]


# Budgets in env steps (were 3000, and 1500 then 2500). The checks need >= 5 policy versions (batches of 128), a
# checkpoint and, for --rnn gru, an evaluation record (the final weights are always evaluated at --frames; that
# result is in the last record, which may carry no training stats, so every record is read: a CI run beside a busy
# loop, where the periodic evaluation at nice 19 did not finish, failed when only training records were read). Measured
# at these budgets under a load of about 10x: --rnn gru 13 versions and its evaluation record, --rnn lstm 12, the
# user encoder 8-9 then 12-13 after the resume, SignMatch 11-12 (five runs each of the last two, two of the others).
FRAMES = 1500
USER_FRAMES = (1000, 1500)  # the user-encoder run, then its resume


def _train(train_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    return launcher.run("train", [*SMALL, *args, "--train-dir", str(train_dir)], timeout=300, env=env)


def _finite_training(run_dir: Path) -> list[dict]:
    records = [r for r in read_metrics(run_dir) if r.get("policy_loss") is not None]
    assert records, "no training record"
    assert all(math.isfinite(r[k]) for r in records for k in ("policy_loss", "value_loss", "grad_norm"))
    print(f"\n{run_dir.name}: policy version {records[-1]['policy_version']} at {records[-1]['frames']:,} frames, "
          f"{sum(r.get('eval_return_mean') is not None for r in records)} eval records")
    assert records[-1]["policy_version"] >= 5 and not records[-1].get("nonfinite_updates")
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt"))
    return records


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_a_recurrent_cartpole_run_trains_and_its_policy_loads_plays_and_exports(tmp_path: Path, rnn: str,
                                                                                capsys) -> None:
    # the evaluator carries the GRU's state; the LSTM's value head is centred (Pong's LSTM needs it)
    extra = ["--eval-every", "1000", "--eval-episodes", "2"] if rnn == "gru" else ["--center-values"]
    proc = _train(tmp_path / "train", "--rnn", rnn, "--frames", str(FRAMES), "--experiment", rnn, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "train" / rnn
    records = _finite_training(run_dir)
    if rnn == "lstm":  # the share of its cells that ran away, at every update
        assert all(0 <= r["core_saturation"] <= 1 for r in records), [r.get("core_saturation") for r in records]
        # the offset added to the head: CartPole's discounted returns (+1 a step) are well above 0
        assert all(math.isfinite(r["value_offset"]) for r in records) and records[-1]["value_offset"] > 2, records[-1]
    else:  # an evaluation of the recurrent policy: a periodic one, or the final one (the last record)
        assert any(r.get("eval_return_mean") is not None for r in read_metrics(run_dir)), read_metrics(run_dir)[-1]
    policy = load_policy(str(run_dir))
    assert isinstance(policy, RecurrentPolicy) and policy.recurrent
    out = tmp_path / "out"
    assert export_main([str(run_dir), "--format", "torchscript", "--out", str(out / "p.pt")]) == 0
    assert export_main([str(run_dir), "--format", "onnx", "--out", str(out / "p.onnx")]) == 0
    info = json.loads((out / "p.json").read_text())
    keys = [s["name"] for s in info["state"]]
    assert keys == (["h"] if rnn == "gru" else ["h", "c"]) and info["state"][0]["shape"] == ["N", 1, 32]
    scripted = torch.jit.load(str(out / "p.pt"))
    session = ort.InferenceSession(str(out / "p.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs", *keys]
    # 50 steps of CartPole, each carrying its own state: the exports' logits and states stay within 1e-5 of the
    # loaded policy's, and their greedy actions are its actions
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=7)
    state = policy.initial_state(1)
    ts_state = [torch.zeros(1, 1, 32) for _ in keys]
    onnx_state = [np.zeros((1, 1, 32), np.float32) for _ in keys]
    for _ in range(50):
        x = torch.from_numpy(np.asarray(obs, np.float32)[None])
        with torch.no_grad():
            logits = policy.head(x, *(state[k] for k in keys))[0]
            ts_logits, *ts_state = scripted(x, *ts_state)
        onnx_logits, *onnx_state = session.run(None, {"obs": x.numpy(), **dict(zip(keys, onnx_state))})
        action, state = policy(obs, state)
        np.testing.assert_allclose(ts_logits.numpy(), logits.numpy(), atol=TOL, rtol=TOL)
        np.testing.assert_allclose(onnx_logits, logits.numpy(), atol=TOL, rtol=TOL)
        for k, a, o in zip(keys, ts_state, onnx_state):
            np.testing.assert_allclose(a.numpy(), state[k].numpy(), atol=TOL, rtol=TOL)
            np.testing.assert_allclose(o, state[k].numpy(), atol=TOL, rtol=TOL)
        assert int(ts_logits.argmax()) == int(action)
        obs, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            obs, _ = env.reset()
            state = policy.initial_state(1)
            ts_state = [torch.zeros(1, 1, 32) for _ in keys]
            onnx_state = [np.zeros((1, 1, 32), np.float32) for _ in keys]
    env.close()
    with pytest.raises(ValueError, match="policy.initial_state"):
        policy(obs)
    assert enjoy_main([str(run_dir), "--episodes", "2", "--greedy"]) == 0  # asyncrl-enjoy carries the state too
    assert "2 episodes: raw score mean" in capsys.readouterr().out


def test_a_user_encoder_trains_through_asyncrl_train_and_resumes(tmp_path: Path) -> None:
    args = ["--encoder", "recurrent_models:small_encoder", "--rnn", "gru", "--experiment", "user"]
    proc = _train(tmp_path, *args, "--frames", str(USER_FRAMES[0]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = _finite_training(tmp_path / "user")
    # The first run stops past its budget by however far the workers got while it stopped (further on a quiet
    # machine), so the resumed budget counts from where it ended.
    budget = max(USER_FRAMES[1], read_metrics(tmp_path / "user")[-1]["env_steps"] + USER_FRAMES[1] - USER_FRAMES[0])
    resumed = _train(tmp_path, *args, "--frames", str(budget), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _finite_training(tmp_path / "user")[-1]["policy_version"] > first[-1]["policy_version"]
    refused = _train(tmp_path, "--experiment", "user", "--frames", "6000", "--resume", "--rnn", "lstm")
    assert refused.returncode == 2 and "--rnn gru" in refused.stderr, refused.stderr


def test_a_recurrent_policy_on_dict_observations_trains_loads_and_exports(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SignMatch: a channels-last image and a vector per step, 8-step episodes cut by a time limit (the
    bootstrapped final observations are valued from the core's state)."""
    monkeypatch.syspath_prepend(str(Path(TESTS).parent))
    proc = launcher.run("train", ["--env", "tests.custom_env:SignMatch", "--frames", str(FRAMES), "--workers", "2",
                                  "--envs-per-worker", "8", "--rollout", "8", "--batch-size", "128", "--epochs", "2",
                                  "--minibatches", "2", "--rnn", "gru", "--rnn-size", "32", "--report-interval", "1",
                                  "--device", "cpu", "--train-dir", str(tmp_path), "--experiment", "sign"],
                        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "sign"
    _finite_training(run_dir)
    policy = load_policy(str(run_dir))
    cues = np.array([[0.8, 0.0], [-0.8, 0.0], [0.5, 0.3], [-0.6, -0.2]], np.float32)
    screens = np.full((4, 36, 36, 3), 5, np.uint8)  # the env's channels-last frames
    actions, state = policy({"screen": screens, "cue": cues}, policy.initial_state(4))
    assert actions.shape == (4,) and state["h"].shape == (4, 1, 32)
    assert export_main([str(run_dir), "--format", "torchscript", "--out", str(tmp_path / "p.pt")]) == 0
    assert export_main([str(run_dir), "--format", "onnx", "--out", str(tmp_path / "p.onnx")]) == 0
    x = {"screen": torch.from_numpy(screens).permute(0, 3, 1, 2).contiguous(), "cue": torch.from_numpy(cues)}
    with torch.no_grad():
        logits, h = policy.head(x, state["h"])
        ts_logits, ts_h = torch.jit.load(str(tmp_path / "p.pt"))(x, state["h"])
    session = ort.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [*(k.key for k in policy.spec.obs_keys), "h"]  # space order
    onnx_logits, onnx_h = session.run(None, {"screen": x["screen"].numpy(), "cue": cues, "h": state["h"].numpy()})
    for got, want in ((ts_logits, logits), (ts_h, h), (onnx_logits, logits), (onnx_h, h)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=TOL, rtol=0)
