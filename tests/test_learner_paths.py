"""The learner's own engine paths, in-process: stale-sample masking, batch gathering from the shared slots,
bf16 against fp32 on one update, and checkpoint pruning."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import Batch, gather_batch
from asyncrl.algo.normalizers import (
    FRAME_STATS_SAMPLES,
    NORM_EPS,
    OBS_CLIP,
    STANDARDIZE_CHUNK_CPU,
    RunningMeanStd,
    fold_frames,
    frame_normalizer,
    standardize_frames,
)
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.models import precision as model_precision
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories, num_slots
from asyncrl.runtime.store.checkpoint import list_checkpoints, save_checkpoint

T, B = 6, 8  # steps x envs of the hand-made batches
MAX_LAG = 2


def make_learner(seed: int = 0, **overrides: object) -> APPOLearner:
    cfg = Config(env="null", minibatches=1, epochs=1, max_policy_lag=MAX_LAG, lr_schedule="constant", lr=1e-3,
                 **overrides)
    torch.manual_seed(seed)
    return APPOLearner(cfg, NULL_SPEC, torch.device("cpu"))


def make_batch(seed: int, lag: torch.Tensor) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(T + 1, B, 4, generator=g),
        actions=torch.randint(0, 2, (T, B), generator=g),
        behaviour_logp=torch.full((T, B), -0.69) + 0.1 * torch.randn(T, B, generator=g),
        rewards=torch.randn(T, B, generator=g),
        terminated=torch.rand(T, B, generator=g) < 0.1,
        truncated=torch.zeros(T, B, dtype=torch.bool),
        final_obs=torch.zeros(B, 4),
        final_step=torch.full((B,), -1),
        lag=lag,
    )


def params(learner: APPOLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def max_change(before: list[torch.Tensor], learner: APPOLearner) -> float:
    return max(float((a - p.detach()).abs().max()) for a, p in zip(before, learner.model.parameters()))


# Columns 0..3 are exactly at the limit (kept), columns 4..7 one update past it (dropped).
KEPT, STALE = slice(0, B // 2), slice(B // 2, B)


def limit_lags() -> torch.Tensor:
    lag = torch.full((T, B), MAX_LAG, dtype=torch.int64)
    lag[:, STALE] = MAX_LAG + 1
    return lag


def test_samples_past_max_policy_lag_are_dropped_and_counted() -> None:
    learner = make_learner(normalize_obs=True)
    batch = make_batch(0, limit_lags())
    batch.obs[:, STALE] = 1000.0  # a stale sample folded into the normaliser would drag its mean far off
    norm = learner.model.obs_normalizer
    count0 = float(norm.count)
    stats = learner.train(batch, frames=0)
    assert stats["samples"] == T * B
    assert stats["dropped_stale"] == T * (B // 2), stats
    assert stats["policy_lag_max"] == MAX_LAG and stats["policy_lag_mean"] == MAX_LAG
    assert learner.samples_trained == T * (B // 2)
    # The normaliser saw exactly the kept samples' observations (bootstrap row excluded).
    kept_obs = batch.obs[:-1, KEPT].reshape(-1, 4).double()
    assert float(norm.count) - count0 == pytest.approx(kept_obs.shape[0])
    torch.testing.assert_close(norm.mean, kept_obs.mean(0) * kept_obs.shape[0] / (kept_obs.shape[0] + count0))


def test_only_the_policys_own_steps_count_as_stale() -> None:
    """Rows masked for another reason (a self-play opponent's or another policy's steps, at their own old
    versions; steps in which the env raised) are not stale samples of this policy."""
    batch = make_batch(0, limit_lags())
    batch.valid = torch.ones(T, B, dtype=torch.bool)
    batch.valid[:, STALE] = False  # the old-version columns are another seat's
    assert make_learner().train(batch, frames=0)["dropped_stale"] == 0
    batch.valid[: T // 2, STALE] = True  # half of them this policy's own, past the lag bound
    assert make_learner().train(batch, frames=0)["dropped_stale"] == (T // 2) * (B // 2)


def test_stale_samples_contribute_nothing_to_the_update() -> None:
    """Rewriting every stale sample (actions, rewards, behaviour log-probs) leaves the update unchanged, while
    rewriting kept samples the same way changes it."""
    lag = limit_lags()
    base = make_batch(0, lag)
    other = make_batch(1, lag)  # same lags, different data everywhere

    def trained(batch: Batch) -> list[torch.Tensor]:
        learner = make_learner()
        learner.train(batch, frames=0)
        return params(learner)

    reference = trained(base)
    stale_rewritten = make_batch(0, lag)
    for name in ("actions", "behaviour_logp", "rewards", "terminated"):
        getattr(stale_rewritten, name)[:, STALE] = getattr(other, name)[:, STALE]
    stale_rewritten.obs[:, STALE] = other.obs[:, STALE]
    for a, b in zip(reference, trained(stale_rewritten)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    kept_rewritten = make_batch(0, lag)
    kept_rewritten.rewards[:, KEPT] = other.rewards[:, KEPT]
    assert max(float((a - b).abs().max()) for a, b in zip(reference, trained(kept_rewritten))) > 1e-6


def test_a_batch_that_is_all_stale_leaves_the_model_unchanged() -> None:
    learner = make_learner(normalize_obs=True)
    before, count0 = params(learner), float(learner.model.obs_normalizer.count)
    stats = learner.train(make_batch(0, torch.full((T, B), MAX_LAG + 1)), frames=0)
    assert stats["dropped_stale"] == T * B and stats["policy_lag_max"] == 0
    assert max_change(before, learner) == 0.0
    assert float(learner.model.obs_normalizer.count) == count0
    assert learner.version == 1  # the update still counts: lag is measured in updates


# --- gather_batch ------------------------------------------------------------------------------------------


def test_gather_batch_is_time_major_with_versions_aligned_to_columns() -> None:
    cfg = Config(env="null", workers=2, envs_per_worker=6, worker_splits=2, rollout=5, batch_size=45,
                 minibatches=1)
    cfg.validate()
    e, t = cfg.envs_per_split, cfg.rollout  # 3 envs per slot, 5 steps
    traj = allocate_trajectories(cfg, NULL_SPEC)
    s = num_slots(cfg)
    # Every value encodes (slot, step, env), so a wrong transpose or reshape shows up as a wrong number.
    slot_i, step_i, env_i = np.meshgrid(np.arange(s), np.arange(t + 1), np.arange(e), indexing="ij")
    code = 1000 * slot_i + 10 * step_i + env_i
    traj["obs"][:] = code[..., None] + np.arange(4) / 10
    traj["actions"][:] = code[:, :t] % 2
    traj["logp"][:] = -code[:, :t]
    traj["rewards"][:] = code[:, :t]
    traj["terminated"][:] = (code[:, :t] % 3) == 0
    traj["truncated"][:] = False
    traj["final_step"][:] = -1
    traj["versions"][:] = 100 * np.arange(s)[:, None] + np.arange(t)[None, :]

    slots = np.array([4, 1, 3])  # not in order: columns follow the order the slots were taken
    version = 999
    batch = gather_batch(traj, slots, version, torch.device("cpu"))
    k = len(slots)
    assert batch.obs.shape == (t + 1, k * e, 4) and batch.obs.dtype == torch.float32
    assert batch.actions.shape == batch.rewards.shape == batch.lag.shape == (t, k * e)
    assert batch.terminated.dtype == torch.bool
    for col in range(k * e):
        slot, env = slots[col // e], col % e
        for step in range(t + 1):
            np.testing.assert_allclose(batch.obs[step, col].numpy(), 1000 * slot + 10 * step + env + np.arange(4) / 10)
        for step in range(t):
            c = 1000 * slot + 10 * step + env
            assert batch.rewards[step, col] == c and batch.behaviour_logp[step, col] == -c
            assert batch.actions[step, col] == c % 2 and bool(batch.terminated[step, col]) == (c % 3 == 0)
            assert batch.lag[step, col] == version - (100 * slot + step)
    # The copy is a snapshot: the slots can be refilled at once.
    traj["rewards"][slots] = -1
    assert batch.rewards[0, 0] == 4000


# --- bf16 --------------------------------------------------------------------------------------------------

IMAGE_SPEC = EnvSpec(name="image", obs_shape=(4, 84, 84), obs_dtype=np.dtype(np.uint8),
                     action_space=gym.spaces.Discrete(6), frameskip=4)
# Tolerances for one update, bf16 encoder against fp32. Adam's first step moves each weight by about +-lr, so a
# weight whose gradient is near zero may move the other way under bf16: compare the update as a whole.
BF16_LOSS_RTOL = 1e-3  # loss (measured: 7e-5)
BF16_GRAD_NORM_RTOL = 2e-2  # gradient norm before clipping (measured: 2e-3)
BF16_UPDATE_COSINE = 0.98  # cosine between the two parameter updates (measured: 0.995)


@pytest.mark.parametrize("native_bf16", [True, False], ids=["native-bf16", "emulated-bf16"])
def test_one_bf16_update_matches_fp32(monkeypatch: pytest.MonkeyPatch, native_bf16: bool) -> None:
    """`--precision auto` picks bf16 for the CNN only on CPUs with native bf16; an explicit bf16 runs either way.
    One update in bf16 matches the same update in fp32 within the BF16_* tolerances, and is not bit-identical to
    it (the encoder really computed in bf16)."""
    monkeypatch.setattr(model_precision, "cpu_has_native_bf16", lambda: native_bf16)
    cpu = torch.device("cpu")
    assert model_precision.resolve_precision("auto", cpu, image_obs=True) == (torch.bfloat16 if native_bf16 else None)
    assert model_precision.resolve_precision("auto", cpu, image_obs=False) is None
    t, b = 4, 4
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        obs=torch.randint(0, 256, (t + 1, b, *IMAGE_SPEC.obs_shape), dtype=torch.uint8, generator=g),
        actions=torch.randint(0, 6, (t, b), generator=g), behaviour_logp=torch.full((t, b), -1.79),
        rewards=torch.randn(t, b, generator=g), terminated=torch.zeros(t, b, dtype=torch.bool),
        truncated=torch.zeros(t, b, dtype=torch.bool),
        final_obs=torch.zeros(b, *IMAGE_SPEC.obs_shape, dtype=torch.uint8),
        final_step=torch.full((b,), -1), lag=torch.zeros(t, b, dtype=torch.int64),
    )
    updates, stats = [], []
    for precision in ("fp32", "auto" if native_bf16 else "bf16"):
        cfg = Config(env="image", minibatches=1, epochs=1, lr_schedule="constant", lr=1e-3, precision=precision)
        torch.manual_seed(0)
        learner = APPOLearner(cfg, IMAGE_SPEC, cpu)
        assert learner.model.compute_dtype == (None if precision == "fp32" else torch.bfloat16)
        before = torch.cat([p.detach().flatten() for p in learner.model.parameters()])
        stats.append(learner.train(batch, frames=0))
        updates.append(torch.cat([p.detach().flatten() for p in learner.model.parameters()]) - before)
    (fp32, bf16), (s32, s16) = updates, stats
    assert not torch.equal(fp32, bf16)
    assert s16["loss"] == pytest.approx(s32["loss"], rel=BF16_LOSS_RTOL)
    assert s16["grad_norm"] == pytest.approx(s32["grad_norm"], rel=BF16_GRAD_NORM_RTOL)
    assert float(torch.nn.functional.cosine_similarity(fp32, bf16, dim=0)) >= BF16_UPDATE_COSINE


# --- frames normalised per pixel (--normalize-obs on images) ----------------------------------------------


def image_batch(t: int, b: int, seed: int = 0) -> Batch:
    """Frames that are black but for one bright moving column and one constant grey pixel per frame."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.zeros((t + 1, b, *IMAGE_SPEC.obs_shape), dtype=torch.uint8)
    obs[..., 10, 20] = 90  # constant: standardised to 0
    cols = torch.randint(0, 84, (t + 1, b), generator=g)
    for i in range(t + 1):
        for j in range(b):
            obs[i, j, :, :, int(cols[i, j])] = 255
    return Batch(
        obs=obs, actions=torch.randint(0, 6, (t, b), generator=g), behaviour_logp=torch.full((t, b), -1.79),
        rewards=torch.randn(t, b, generator=g), terminated=torch.zeros(t, b, dtype=torch.bool),
        truncated=torch.zeros(t, b, dtype=torch.bool),
        final_obs=torch.zeros(b, *IMAGE_SPEC.obs_shape, dtype=torch.uint8),
        final_step=torch.full((b,), -1), lag=torch.zeros(t, b, dtype=torch.int64),
    )


def test_frames_are_standardised_per_pixel_and_not_scaled_again() -> None:
    """With --normalize-obs, uint8 frames get a running mean and variance per pixel (from the batch's trained
    frames, the bootstrap row left out), the CNN reads the standardised pixels without its 1/255 scaling, and the
    exported policy head computes the same outputs from raw frames."""
    from asyncrl.agents.appo.head import PolicyHead

    t, b = 4, 4
    cfg = Config(env="image", minibatches=1, epochs=1, lr_schedule="constant", lr=1e-3, precision="fp32",
                 normalize_obs=True)
    torch.manual_seed(0)
    learner = APPOLearner(cfg, IMAGE_SPEC, torch.device("cpu"))
    model, norm = learner.model, learner.model.obs_normalizer
    assert norm.shape == IMAGE_SPEC.obs_shape and model.encoder.input_scale == 1.0
    batch = image_batch(t, b)
    with torch.no_grad():  # before any statistics, standardising is the CNN's usual / 255
        torch.testing.assert_close(model._normalized(batch.obs[0]), batch.obs[0].float() / 255.0)
    learner.train(batch, frames=0)
    reference = RunningMeanStd(IMAGE_SPEC.obs_shape)  # every trained frame, in float64, from the same prior
    reference.var.fill_(255.0**2)
    reference.update(batch.obs[:-1].reshape(-1, *IMAGE_SPEC.obs_shape))
    assert float(norm.count) == pytest.approx(float(reference.count), abs=1e-6)
    torch.testing.assert_close(norm.mean, reference.mean, rtol=0, atol=1e-3)
    torch.testing.assert_close(norm.var, reference.var, rtol=1e-4, atol=1e-3)
    raw = image_batch(1, 3, seed=1).obs[0]
    standardised = norm.normalize(raw.double()).float()
    assert float(standardised[..., 10, 20].abs().max()) < 0.01  # the constant pixel is about 0, not 90/255
    assert float(standardised.abs().max()) == 5.0  # a column never lit before is clipped
    with torch.no_grad():
        logits, _ = model(raw)
        torch.testing.assert_close(model.policy_head(model.encoder(standardised)), logits, rtol=0, atol=1e-5)
        model.encoder.input_scale = 1.0 / 255.0  # the CNN's own scaling on top would shrink its input 255x
        assert float((model(raw)[0] - logits).abs().max()) > 1e-3
        model.encoder.input_scale = 1.0
        torch.testing.assert_close(PolicyHead(model, IMAGE_SPEC)(raw), logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frames_standardised_in_chunks_match_the_formula(dtype: torch.dtype) -> None:
    """20 frames in chunks of 9 (9, 9, then 2), from leading dimensions [4, 5]: each value is clamp((x - mean) /
    sqrt(var + eps), -5, 5) to float32 rounding, stored as `dtype`."""
    g = torch.Generator().manual_seed(3)
    frames = torch.randint(0, 256, (4, 5, *IMAGE_SPEC.obs_shape), dtype=torch.uint8, generator=g)
    stats = frame_normalizer(IMAGE_SPEC.obs_shape)
    fold_frames(stats, frames[:, :3])
    assert STANDARDIZE_CHUNK_CPU // frames[0, 0].numel() == 9
    out = standardize_frames(frames, stats, dtype)
    expected = ((frames.double() - stats.mean) / (stats.var + NORM_EPS).sqrt()).clamp(-OBS_CLIP, OBS_CLIP)
    assert out.dtype == dtype and out.shape == frames.shape
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5 if dtype == torch.float32 else 0.02)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("normalize_obs", [True, False])
def test_a_batch_prepared_once_reads_as_prepared_per_minibatch(precision: str, normalize_obs: bool) -> None:
    """The learner standardises (or scales by 1 / 255) a batch's frames once for all its epochs (`prepare_input`,
    in the encoder's compute dtype) and the model, inside `prepared_input`, does not do it again: the same outputs
    as the policy workers' path, which does it every call."""
    cfg = Config(env="image", minibatches=2, epochs=2, lr_schedule="constant", precision=precision,
                 normalize_obs=normalize_obs)
    torch.manual_seed(0)
    learner = APPOLearner(cfg, IMAGE_SPEC, torch.device("cpu"))
    learner.train(image_batch(4, 4), frames=0)  # statistics away from the prior
    model, raw = learner.model, image_batch(1, 6, seed=2).obs[0]
    prepared = model.prepare_input(raw)
    assert prepared.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    with torch.no_grad():
        logits, value = model(raw)
        with model.prepared_input():
            again, value_again = model(prepared)
            with pytest.raises(RuntimeError, match="before entering"):  # inside, nothing would be scaled
                model.prepare_input(raw)
        torch.testing.assert_close(again, logits, rtol=0, atol=0)
        torch.testing.assert_close(value_again, value, rtol=0, atol=0)
        assert not model.input_ready and model.encoder.input_scale == (1.0 if normalize_obs else 1.0 / 255.0)
        assert float((model(prepared.float())[0] - logits).abs().max()) > 1e-3  # prepared twice


def test_a_large_batch_folds_a_strided_sample_of_its_trained_frames() -> None:
    """At most FRAME_STATS_SAMPLES frames a batch, every k-th of those the mask keeps (the others never count)."""
    cfg = Config(env="image", minibatches=1, epochs=1, lr_schedule="constant", precision="fp32", normalize_obs=True)
    learner = APPOLearner(cfg, IMAGE_SPEC, torch.device("cpu"))
    t, b = 40, 16  # 640 frames, 600 of them kept
    obs = torch.zeros((t, b, *IMAGE_SPEC.obs_shape), dtype=torch.uint8)
    values = torch.arange(t * b).reshape(t, b) % 200
    obs[:, :, 0, 0, 0] = values
    mask = torch.ones(t, b, dtype=torch.bool)
    mask[:, -1] = False
    obs[:, -1, 0, 0, 0] = 255  # masked out: would pull the mean up
    learner.model.update_obs_normalizer(obs, mask)
    picked = values[mask][::3].double()  # ceil(600 / 256) = 3: every third kept frame
    assert picked.numel() <= FRAME_STATS_SAMPLES
    norm = learner.model.obs_normalizer
    assert float(norm.count) == pytest.approx(picked.numel(), abs=1e-3)
    assert float(norm.mean[0, 0, 0]) == pytest.approx(float(picked.mean()), abs=1e-2)
    assert float(norm.var[0, 0, 0]) == pytest.approx(float(picked.var(unbiased=False)), rel=1e-3)
    assert float(norm.mean[0, 0, 1]) == 0.0 and float(norm.var[0, 0, 1]) < 0.1  # a constant pixel, not the 255**2 prior


# --- checkpoint pruning ------------------------------------------------------------------------------------


def test_checkpoints_are_pruned_to_keep_checkpoints(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    for version in (3, 7, 5, 12, 9):  # saved out of order: pruning goes by version, not by age
        save_checkpoint(run_dir, version, {"version": version}, keep=3)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == sorted(f"ckpt_{v:010d}.pt{ext}" for v in (12, 9, 7) for ext in ("", ".sha256"))
    assert [Path(p).name for p in list_checkpoints(run_dir)] == [f"ckpt_{v:010d}.pt" for v in (12, 9, 7)]
    save_checkpoint(run_dir, 13, {"version": 13}, keep=1)
    assert [Path(p).name for p in list_checkpoints(run_dir)] == ["ckpt_0000000013.pt"]
    assert len(list((tmp_path / "checkpoints").iterdir())) == 2
