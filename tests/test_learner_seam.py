"""The learner seam: `--algo` picks a registered learner, any class with the protocol plugs in, APPO publishes only
its actor-critic, and the runner's aggregation averages whatever stats a learner reports."""

from __future__ import annotations

import pytest
import torch

from asyncrl.agents import registry
from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.base import Learner, no_gradient_sync, no_heartbeat, same_update_count
from asyncrl.agents.batch import Batch
from asyncrl.config import Config, ConfigError
from asyncrl.diagnostics.aggregate import Totals, learner_stats
from asyncrl.envs.base import EnvSpec
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.launch import validate
from asyncrl.models.actor_critic import flat_state
from tests.train_cli import main_in_process


class CountingLearner:
    """The smallest learner: counts batches, publishes a one-layer policy, never steps an optimizer."""

    stat_names = ("batches_seen",)

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device):
        self.cfg, self.spec, self.device = cfg, spec, device
        self.model = self.build_policy(spec, cfg, device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)
        self.version = self.samples_trained = self.nonfinite_streak = 0
        self.lr = cfg.lr
        self.sync_gradients = no_gradient_sync
        self.agree_updates, self.heartbeat = same_update_count, no_heartbeat
        self.extra_parameters, self.return_normalizer = (), None

    @staticmethod
    def build_policy(spec: EnvSpec, cfg: Config, device: torch.device) -> torch.nn.Module:
        return torch.nn.Linear(spec.obs_shape[0], 2).to(device)

    def train(self, batch: Batch, frames: int) -> dict[str, float]:
        self.version += 1
        self.samples_trained += batch.rewards.numel()
        return {"batches_seen": float(self.version)}

    def policy_module(self) -> torch.nn.Module:
        return self.model

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.version = int(state["version"])


def test_unknown_algo_is_one_line_and_exit_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--algo must be one of appo"):
        validate(Config(env="CartPole-v1", algo="nope").resolve())
    result = main_in_process(["--env", "CartPole-v1", "--algo", "nope"], tmp_path, capsys)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--algo must be one of appo, redq, sac, td3 (got 'nope')" in lines[0], result.stderr


def test_a_registered_learner_is_built_by_make_learner(monkeypatch) -> None:
    monkeypatch.setitem(registry.LEARNERS, "counting", CountingLearner)
    cfg = Config(env="null", algo="counting").resolve()
    validate(cfg)  # a registered name passes --algo's check
    learner = registry.make_learner(cfg, NULL_SPEC, torch.device("cpu"))
    assert isinstance(learner, CountingLearner) and isinstance(learner, Learner)
    policy = registry.learner_class("counting").build_policy(NULL_SPEC, cfg, torch.device("cpu"))
    assert [t.shape for t in flat_state(policy)] == [t.shape for t in flat_state(learner.policy_module())]


def test_appo_is_the_default_and_publishes_only_its_actor_critic() -> None:
    cfg = Config(env="null")
    learner = registry.make_learner(cfg, NULL_SPEC, torch.device("cpu"))
    assert isinstance(learner, APPOLearner) and isinstance(learner, Learner)
    published = flat_state(learner.policy_module())
    model_tensors = [t for t in learner.model.state_dict(keep_vars=True).values() if t.dtype.is_floating_point]
    assert len(published) == len(model_tensors) and all(a is b for a, b in zip(published, model_tensors))
    optimizer_state = {id(v) for s in learner.optimizer.state.values() for v in s.values()}
    assert not optimizer_state & {id(t) for t in published}
    acting = APPOLearner.build_policy(NULL_SPEC, cfg, torch.device("cpu"))  # what a policy worker builds
    assert [t.shape for t in flat_state(acting)] == [t.shape for t in published]


def test_aggregate_averages_any_stat_and_keeps_the_special_rules() -> None:
    reports = [
        {"new_stat": 1.0, "policy_lag_max": 2, "learning_rate": 1e-3, "nonfinite_updates": 0, "dropped_stale": 5,
         "t_train": 0.5, "samples": 64},
        {"new_stat": 3.0, "policy_lag_max": 7, "learning_rate": 5e-4, "nonfinite_updates": 1, "dropped_stale": 1,
         "t_train": 0.5, "samples": 64},
        {"samples": 64, "t_wait": 0.1},  # a sampling-only report: no trained stat
    ]
    out = learner_stats(reports, names=("announced_only",))
    assert out == {"announced_only": None, "new_stat": 2.0, "policy_lag_max": 7, "learning_rate": 5e-4,
                   "nonfinite_updates": 1}
    totals = Totals()
    for r in reports:
        totals.add_learner(r)
    assert totals.dropped_stale == 6
    assert learner_stats([], names=("kl", "nonfinite_updates")) == {"kl": None, "nonfinite_updates": 0}
