"""A flaky simulator does not end the run: a failing env instance is replaced, its step left out of training,
errors are judged as a rate, and whatever stops the run leaves a final checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import Batch
from asyncrl.config import Config
from asyncrl.envs.base import EnvBroken
from asyncrl.envs.gym_env import GymVecEnv
from asyncrl.envs.registry import make_env_spec
from asyncrl.runtime.store.checkpoint import list_checkpoints
from tests.conftest import read_metrics, shm_entries, start_train
from tests.faults import RaiseEvery

REPO = Path(__file__).resolve().parents[1]
RUN = ["--workers", "2", "--envs-per-worker", "8", "--report-interval", "2", "--hang-timeout", "60"]


def _vec(factory, n: int = 3) -> tuple[GymVecEnv, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """The backend, its observation and reward arrays, and (terminated, truncated, final_obs) for `step`."""
    env = GymVecEnv("x", factory, n)
    obs = np.zeros((n, 4), np.float32)
    env.reset(seed=0, obs_out=obs)
    return env, obs, np.zeros(n, np.float32), (np.zeros(n, bool), np.zeros(n, bool), np.zeros((n, 4), np.float32))


def test_a_raising_env_instance_is_replaced_and_the_others_carry_on() -> None:
    made: list[gym.Env] = []

    def factory() -> gym.Env:
        made.append(RaiseEvery(gym.make("CartPole-v1"), 5 if len(made) == 1 else 10**9))  # env 1's first instance
        return made[-1]

    env, obs, reward, ends = _vec(factory)
    before = [e.unwrapped.state.copy() for e in env.envs]
    for _ in range(4):
        env.step(np.zeros(3, np.int64), obs, reward, *ends)
    assert not env.faults
    first = env.envs[1]
    env.step(np.zeros(3, np.int64), obs, reward, *ends)  # env 1's 5th step raises
    assert [(f.index, f.where) for f in env.faults] == [(1, "step")]
    assert "simulator crashed at step 5" in env.faults[0].message
    assert env.envs[1] is not first and env.envs[1] is made[-1] and len(made) == 4
    terminated, truncated, _ = ends
    # The unfinished episode is dropped; the failed step carries no episode-end flag (the worker marks it invalid).
    assert not terminated[1] and not truncated[1] and reward[1] == 0.0 and env.episodes.lengths[1] == 0
    np.testing.assert_allclose(obs[1], env.envs[1].unwrapped.state, rtol=1e-6)  # the fresh instance's first observation
    assert env.episodes.lengths[0] == env.episodes.lengths[2] == 5 and not terminated[[0, 2]].any()  # the others go on
    assert not np.allclose(before[0], env.envs[0].unwrapped.state)


def test_a_fresh_instance_that_fails_before_its_first_step_is_broken() -> None:
    made: list[int] = []

    def factory() -> gym.Env:
        made.append(1)
        if len(made) > 2:
            raise OSError("simulator binary gone")
        return RaiseEvery(gym.make("CartPole-v1"), 3)

    env, obs, reward, ends = _vec(factory, n=2)
    env.step(np.zeros(2, np.int64), obs, reward, *ends)
    env.step(np.zeros(2, np.int64), obs, reward, *ends)
    with pytest.raises(EnvBroken, match="fresh instance failed before its first step .creating it: OSError"):
        env.step(np.zeros(2, np.int64), obs, reward, *ends)  # env 0 raises; no replacement can be made

    class BrokenReset(gym.Wrapper):
        def reset(self, **kwargs):
            raise OSError("no licence")

    with pytest.raises(EnvBroken, match="no licence"):
        _vec(lambda: BrokenReset(gym.make("CartPole-v1")))


def test_a_failed_step_is_cut_out_of_the_loss_and_the_trace() -> None:
    """Nothing of a failed step (its reward, its action) reaches the update, and nothing after it reaches the
    steps before it through the V-trace recursion."""
    cfg = Config(env="CartPole-v1", normalize_advantages=False)
    torch.manual_seed(0)
    t, b, bad_t, bad_env = 8, 4, 4, 2
    obs = torch.randn(t + 1, b, 4)
    base = Batch(obs=obs, actions=torch.randint(0, 2, (t, b)), behaviour_logp=torch.full((t, b), -0.69),
                 rewards=torch.ones(t, b), terminated=torch.zeros(t, b, dtype=torch.bool),
                 truncated=torch.zeros(t, b, dtype=torch.bool), final_obs=torch.zeros(b, 4),
                 final_step=torch.full((b,), -1), lag=torch.zeros(t, b, dtype=torch.long),
                 valid=torch.ones(t, b, dtype=torch.bool))
    base.valid[bad_t, bad_env] = False
    base.lag[bad_t + 1:, bad_env] = 100  # too stale to train: what follows the error may only act through the trace

    def grads(batch: Batch) -> list[torch.Tensor]:
        learner = APPOLearner(cfg, make_env_spec("CartPole-v1"), torch.device("cpu"))
        learner.model.load_state_dict(model_state)
        learner._step(batch, batch.trainable(cfg.max_policy_lag))
        return [p.grad.clone() for p in learner.model.parameters()]

    model_state = APPOLearner(cfg, make_env_spec("CartPole-v1"), torch.device("cpu")).model.state_dict()
    reference = grads(base)
    garbage = Batch(**{f: None if (x := getattr(base, f)) is None else x.clone() for f in base.__dataclass_fields__})
    garbage.rewards[bad_t:, bad_env] = 1e6  # whatever the failed step wrote, and the fresh instance's rewards
    garbage.obs[bad_t + 1:, bad_env] = 1e3  # and observations
    garbage.actions[bad_t, bad_env] = 1 - garbage.actions[bad_t, bad_env]
    for got, want in zip(grads(garbage), reference, strict=True):
        torch.testing.assert_close(got, want)
    all_valid = Batch(**{f: getattr(garbage, f) for f in base.__dataclass_fields__ if f != "valid"})
    assert any(not torch.allclose(g, r) for g, r in zip(grads(all_valid), reference, strict=True))


@pytest.fixture
def importable_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets the run's processes import `tests.faults`."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


@pytest.mark.usefixtures("importable_tests")
def test_flaky_env_trains_without_stopping(tmp_path: Path, reap: list) -> None:
    """Each env instance raises once per 500 steps: 2 workers x 8 envs train 20k env steps and finish (each
    instance, and each one that replaced it, raises at its 500th step: 2 errors per env slot by 16k env steps)."""
    before_shm = shm_entries()
    run = start_train(["--env", "tests.faults:make_flaky_cartpole", *RUN, "--frames", "20000"],
                      tmp_path / "train", experiment="flaky")
    reap.append(run)
    assert run.wait(timeout=300) == 0, run.stdout()[-2000:] + run.stderr()[-2000:]
    records = read_metrics(run.run_dir)
    print(f"\nflaky env: last record {records[-1]['env_steps']:,} env steps, {records[-1]['env_errors']} env errors")
    assert records[-1]["env_steps"] > 16_000  # the last record may precede the final second
    assert records[-1]["env_errors"] >= 16  # each of the 16 envs reached its 500th step
    assert records[-1]["worker_restarts"] == 0  # the workers and their other envs carried on
    assert "replaced env" in run.stdout() and "stopping (frames)" in run.stdout()
    assert "Traceback" not in run.stderr()
    assert ours(shm_entries() - before_shm) == set()  # other programs on the machine may come and go


@pytest.mark.usefixtures("importable_tests")
def test_env_that_always_raises_stops_the_run_in_one_line_with_a_final_checkpoint(tmp_path: Path,
                                                                                   reap: list) -> None:
    run = start_train(["--env", "tests.faults:make_crashing_cartpole", *RUN, "--frames", "1000000"],
                      tmp_path / "train", experiment="crashing")
    reap.append(run)
    assert run.wait(timeout=180) == 1, run.stdout()[-2000:] + run.stderr()[-2000:]
    errors = [line for line in run.stderr().splitlines() if line.strip()]
    assert len(errors) == 1, run.stderr()
    line = errors[0]
    assert line.startswith("asyncrl: error: env tests.faults:make_crashing_cartpole raised in"), line
    assert "RuntimeError: simulator crashed at step 1" in line and "--max-env-error-rate 0.01" in line
    saved = re.search(r"final checkpoint, (ckpt_\d+\.pt)", line)
    assert saved, line
    assert Path(list_checkpoints(str(run.run_dir))[0]).name == saved.group(1)


def ours(entries: set[str]) -> set[str]:
    """What this project could leave in /dev/shm: multiprocessing arenas (faster-fifo) or named asyncrl files."""
    return {e for e in entries if e.startswith(("pym-", "asyncrl", "psm_", "mp-"))}
