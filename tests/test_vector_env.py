"""The batched backend (a gymnasium VectorEnv per worker split) through the real rollout worker and shared slots.

`tests.vector_envs.CodedVectorEnv` encodes env index, episode and step in every observation and reward, so each
slot row can be checked against where it came from, in every autoreset mode.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.batch import gather_batch
from asyncrl.config import Config
from asyncrl.envs.base import EnvError
from asyncrl.envs.registry import make_env_spec, make_vec_env
from asyncrl.envs.vector_env import VectorVecEnv
from asyncrl.runtime.plumbing.trajectories import NO_FINAL
from tests.conftest import collect_rollout_slots, run_cli
from tests.vector_envs import episode_length

ENVS, ROLLOUT = 4, 12
MODES = ("NextStep", "SameStep", "Disabled")


def collect_two_slots(mode: str) -> tuple[dict[str, np.ndarray], list[int], list[dict]]:
    """Run the real rollout worker on CodedVectorEnv for two consecutive slots; (the slot arrays, the two slots
    in order, the worker's reports)."""
    cfg = Config(env="tests.vector_envs:coded", env_kwargs=json.dumps({"autoreset_mode": mode}), workers=1,
                 envs_per_worker=ENVS, worker_splits=1, rollout=ROLLOUT, batch_size=ENVS * ROLLOUT, minibatches=1)
    arrays, reports = collect_rollout_slots(cfg, [0, 1])
    return arrays, [0, 1], reports


def check_slot(a: dict[str, np.ndarray], slot: int, mode: str) -> int:
    """Every row of `slot` is the transition its coded observation says; returns the slot's reset steps."""
    obs, reward, valid, first = a["obs"][slot], a["rewards"][slot], a["valid"][slot], a["first"][slot]
    term, trunc = a["terminated"][slot], a["truncated"][slot]
    final_obs, final_step = a["final_obs"][slot], a["final_step"][slot]
    skipped = 0
    for e in range(ENVS):
        length, truncations = episode_length(e), []
        for t in range(ROLLOUT):
            (i, k, s), (i1, k1, s1) = obs[t, e], obs[t + 1, e]
            assert i == i1 == e, f"env {e} step {t}: a row of another env"
            if not valid[t, e]:  # only NEXT_STEP has reset steps: from the reached observation to a new episode
                assert mode == "NextStep" and s == length and (k1, s1) == (k + 1, 0), (mode, e, t, obs[t, e])
                assert reward[t, e] == 0 and not term[t, e] and not trunc[t, e] and first[t + 1, e]
                skipped += 1
                continue
            assert s < length, f"env {e} step {t}: acting on an ended episode's observation {obs[t, e]}"
            assert reward[t, e] == 100 * e + s + 1, f"env {e} step {t}: reward {reward[t, e]}"
            if s + 1 < length:
                assert (k1, s1) == (k, s + 1) and not term[t, e] and not trunc[t, e] and not first[t + 1, e]
                continue
            assert term[t, e] == (k % 2 == 0) and trunc[t, e] == (k % 2 == 1) and first[t + 1, e]
            if mode == "NextStep":
                assert (k1, s1) == (k, length), "NEXT_STEP keeps the reached observation until its reset step"
                if t + 1 < ROLLOUT:
                    assert not valid[t + 1, e], "the step after an episode end is the env's reset step"
            else:
                assert (k1, s1) == (k + 1, 0), "the next episode starts in the same step"
            if trunc[t, e]:
                truncations.append((t, k))
        if truncations:
            t, k = truncations[0]
            assert final_step[e] == t and tuple(final_obs[e]) == (e, k, length), (e, final_step[e], final_obs[e])
        else:
            assert final_step[e] == NO_FINAL
    return skipped


@pytest.mark.parametrize("mode", MODES)
def test_every_transition_lands_in_its_row_and_reset_steps_are_not_trained(mode: str) -> None:
    a, (first_slot, second_slot), reports = collect_two_slots(mode)
    skipped = sum(check_slot(a, slot, mode) for slot in (first_slot, second_slot))
    assert (skipped > 0) == (mode == "NextStep")
    assert (a["obs"][second_slot, 0] == a["obs"][first_slot, ROLLOUT]).all(), "the bootstrap row starts the next"
    assert (a["first"][second_slot, 0] == a["first"][first_slot, ROLLOUT]).all()
    # The learner's loss mask leaves out exactly the reset steps.
    batch = gather_batch(a, np.array([first_slot, second_slot]), version=0, device=torch.device("cpu"))
    mask = batch.trainable(max_policy_lag=10)
    assert int(mask.sum()) == 2 * ROLLOUT * ENVS - skipped
    # Agent steps counted and episodes reported: no reset step among them.
    assert sum(r["env_steps"] for r in reports) == 2 * ROLLOUT * ENVS - skipped
    episodes = [ep for r in reports for ep in r["episodes"]]
    assert episodes
    for ret, length, _truncated in episodes:
        e = length - 3
        assert 0 <= e < ENVS and ret == sum(100 * e + s for s in range(1, length + 1)), (ret, length)


def test_gymnasium_ids_with_a_vectorised_implementation_are_batched() -> None:
    env = make_vec_env("CartPole-v1", 16)
    try:
        assert isinstance(env, VectorVecEnv) and env.spec.batched and env.num_envs == 16
    finally:
        env.close()
    loop = make_vec_env("CartPole-v1", 2, env_vectorization="loop")
    try:
        assert not isinstance(loop, VectorVecEnv) and not loop.spec.batched
    finally:
        loop.close()


def test_a_vector_env_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(EnvError, match="VectorEnv of 3 envs where 4 were asked for"):
        make_vec_env("tests.vector_envs:three_envs", 4)


@pytest.mark.parametrize("env, message", [
    ("tests.vector_envs:not_an_env", "returned a list, neither a gymnasium.Env nor a gymnasium.vector.VectorEnv"),
    ("tests.vector_envs:three_envs", "returned a VectorEnv of 3 envs where 4 were asked for"),
])
def test_bad_batched_envs_stop_the_run_in_one_line(env: str, message: str, tmp_path: Path) -> None:
    proc = run_cli(["--env", env, "--workers", "1", "--envs-per-worker", "4", "--worker-splits", "1",
                    "--rollout", "8", "--batch-size", "32", "--minibatches", "1", "--frames", "2000"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("*")), "bad input must leave nothing written"


def test_gymnax_without_its_extra_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("gymnax", "jax") else
                        real(name, *a))
    with pytest.raises(EnvError, match=r"needs the gymnax extra \(gymnax and jax\): "
                                       r"pip install -e '\.\[gymnax\]' in the asyncrl checkout"):
        make_env_spec("gymnax:Breakout-MinAtar")


def test_frames_smaller_than_the_cnn_takes_go_to_the_mlp() -> None:
    from asyncrl.envs.base import EnvSpec
    from asyncrl.models.actor_critic import build_model
    from asyncrl.models.encoders import MLP, NatureCNN

    minatar = EnvSpec("grid", (4, 10, 10), np.dtype(np.float32), gym.spaces.Discrete(3), frameskip=1)
    atari = EnvSpec("frames", (4, 84, 84), np.dtype(np.uint8), gym.spaces.Discrete(3), frameskip=4)
    assert not minatar.has_image and atari.has_image
    assert isinstance(build_model(minatar).encoder, MLP) and isinstance(build_model(atari).encoder, NatureCNN)
