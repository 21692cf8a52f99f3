"""Normalisation maths: exact cross-rank moment pooling, return normalisation, the symlog value transform."""

from __future__ import annotations

import multiprocessing as mp
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from asyncrl import config
from asyncrl.agents.appo.loss import APPOHyperparams, appo_loss
from asyncrl.algo.moment_sync import MomentSync, moment_modules
from asyncrl.algo.normalizers import RunningMeanStd, symexp, symlog
from asyncrl.algo.return_norm import ReturnNormalizer
from asyncrl.algo.value_transform import ValueTransform
from asyncrl.config import ConfigError
from asyncrl.resolve import parse_command_line

SIZES = ((50, 7), (3, 120))  # samples per rank in each of two rounds: unequal, so averaging is wrong


def rank_data(rank: int, round_: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * rank + round_)
    return torch.randn(SIZES[round_][rank], 3, generator=gen, dtype=torch.float64) * (1 + 4 * rank) + 10 * rank


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.obs_normalizer = RunningMeanStd((3,))
        self.linear = nn.Linear(3, 1)
        self.register_buffer("other", torch.zeros(2))


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from asyncrl.runtime.distributed.group import Group
    from asyncrl.runtime.distributed.rank import BOARD_WORDS, DataParallel, RankInfo

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    # MomentSync on its own: two rounds, so a shared history counted twice would show.
    stats = RunningMeanStd((3,))
    sync = MomentSync([stats])
    for round_ in range(2):
        stats.update(rank_data(rank, round_))
        sync.pool()
    torch.save(stats.state_dict(), f"{out_dir}/sync{rank}.pt")
    # The learners' per-update agreement (distributed/group.py) with a model holding an obs normaliser.
    info = RankInfo(rank, 2, rank, 2, f"127.0.0.1:{port}")
    board = np.zeros(BOARD_WORDS)
    ranks = DataParallel(info, out_dir, 30.0, True, board)
    model = Model()
    model.other.fill_(float(rank))
    learner = SimpleNamespace(device=torch.device("cpu"), cfg=SimpleNamespace(run_dir=out_dir, frames=0),
                              model=model, samples_trained=0, lr=1e-3, spec=SimpleNamespace(frameskip=1), version=0,
                              return_normalizer=ReturnNormalizer(), extra_parameters=())
    channels = SimpleNamespace(stopping=False)
    group = Group(ranks, learner, channels, dist, torch)
    for round_ in range(2):
        model.obs_normalizer.update(rank_data(rank, round_))
        learner.return_normalizer.update(rank_data(rank, round_)[:, 0], scale=2.0)
        group.agree(learner, {}, channels)
    torch.save({"model": model.state_dict(), "returns": learner.return_normalizer.state_dict()},
               f"{out_dir}/agree{rank}.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pool")
    ctx = mp.get_context("spawn")  # a fresh interpreter: this one's torch thread pool does not survive a fork
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0]
    return out


def concatenated() -> RunningMeanStd:
    every = RunningMeanStd((3,))
    every.update(torch.cat([rank_data(r, i) for i in range(2) for r in range(2)]))
    return every


def assert_same_moments(a: dict[str, torch.Tensor], b: RunningMeanStd) -> None:
    torch.testing.assert_close(a["count"], b.count)
    torch.testing.assert_close(a["mean"], b.mean)
    torch.testing.assert_close(a["var"], b.var)


def test_pooled_moments_equal_those_of_the_concatenated_data_on_every_rank(pooled: Path) -> None:
    states = [torch.load(pooled / f"sync{r}.pt") for r in range(2)]
    for state in states:
        assert_same_moments(state, concatenated())
    for key in ("count", "mean", "var"):
        assert torch.equal(states[0][key], states[1][key])


def test_the_learners_agreement_pools_normalisers_exactly(pooled: Path) -> None:
    saved = [torch.load(pooled / f"agree{r}.pt") for r in range(2)]
    for state in saved:
        obs = {k.removeprefix("obs_normalizer."): v for k, v in state["model"].items() if k.startswith("obs_")}
        assert_same_moments(obs, concatenated())
        assert torch.equal(state["model"]["other"], torch.full((2,), 0.5))  # other buffers: still averaged
    returns = RunningMeanStd(())
    returns.update(torch.cat([rank_data(r, i)[:, 0] * 2.0 for i in range(2) for r in range(2)]))
    for state in saved:
        got = {k.removeprefix("moments."): v for k, v in state["returns"].items()}
        assert_same_moments(got, returns)
    # What averaging the ranks' states gave before: visibly not the pooled moments.
    ranks = [RunningMeanStd((3,)) for _ in range(2)]
    for r, stats in enumerate(ranks):
        stats.update(rank_data(r, 0))
    averaged_mean = (ranks[0].mean + ranks[1].mean) / 2
    every = RunningMeanStd((3,))
    every.update(torch.cat([rank_data(0, 0), rank_data(1, 0)]))
    assert not torch.allclose(averaged_mean, every.mean, atol=0.5)


def test_moments_survive_a_checkpoint_round_trip(pooled: Path) -> None:
    state = torch.load(pooled / "sync0.pt")
    restored = RunningMeanStd((3,))
    restored.load_state_dict(state)
    assert_same_moments(state, restored)
    sync = MomentSync(moment_modules(restored))
    restored.update(rank_data(0, 0))
    sync.apply(sync.delta())  # one rank: pooling is the identity
    expect = RunningMeanStd((3,))
    expect.load_state_dict(state)
    expect.update(rank_data(0, 0))
    assert_same_moments(restored.state_dict(), expect)
    norm = ReturnNormalizer()
    norm.update(torch.tensor([3.0, -4.0]), scale=1.0)
    again = ReturnNormalizer()
    again.load_state_dict(norm.state_dict())
    assert again.scale == pytest.approx(norm.scale)


def test_return_normalizer_scale_is_the_rms_of_the_raw_targets() -> None:
    norm = ReturnNormalizer()
    assert norm.scale == 1.0
    targets = torch.tensor([[1.0, 2.0], [3.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    norm.observer(10.0)(targets, mask)  # raw targets: 10, 20, 30 (the masked one left out)
    assert norm.scale == pytest.approx(float(np.sqrt((100 + 400 + 900) / 3)), rel=1e-4)
    flat = ReturnNormalizer()
    flat.update(torch.full((100,), 100.0), scale=1.0)  # constant returns: std 0, RMS 100
    assert flat.scale == pytest.approx(100.0, rel=1e-4)


def toy_chain(scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A 4-step on-policy chain, one env: rewards 1, 2, 3, 40 then termination."""
    t = 4
    return dict(logp=torch.zeros(t, 1), entropy=torch.zeros(t, 1), behaviour_logp=torch.zeros(t, 1),
                rewards=torch.tensor([[1.0], [2.0], [3.0], [40.0]]) * scale,
                terminated=torch.tensor([[False], [False], [False], [True]]), mask=torch.ones(t, 1))


def true_values(gamma: float) -> torch.Tensor:
    rewards, v, out = [1.0, 2.0, 3.0, 40.0], 0.0, []
    for r in reversed(rewards):
        v = r + gamma * v
        out.append(v)
    return torch.tensor(out[::-1] + [0.0]).reshape(5, 1)


def test_return_scaling_gives_the_same_targets_in_scaled_units() -> None:
    hp = APPOHyperparams(gamma=0.9, c_bar=0.95, normalize_advantages=False)
    seen: dict[str, torch.Tensor] = {}
    values = torch.tensor([[5.0], [4.0], [3.0], [2.0], [0.0]])
    appo_loss(**toy_chain(100.0), values=values * 100.0, hp=hp, on_targets=lambda vs, m: seen.update(raw=vs))
    appo_loss(**toy_chain(100.0), values=values, hp=hp, reward_scale=100.0,
              on_targets=lambda vs, m: seen.update(scaled=vs))
    torch.testing.assert_close(seen["scaled"] * 100.0, seen["raw"])


def test_symlog_round_trip_and_loss_gradient() -> None:
    x = torch.tensor([-1e6, -3.0, -1e-3, 0.0, 1e-3, 0.5, 7.0, 1e6], dtype=torch.float64)
    torch.testing.assert_close(symexp(symlog(x)), x)
    transform = ValueTransform("symlog")
    head = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    targets = torch.tensor([10.0, -5.0, 2.0])
    transform.loss(head, targets).backward()
    torch.testing.assert_close(head.grad, (head.detach() - symlog(targets)) / 3)
    with pytest.raises(ValueError):
        ValueTransform("log")


def test_symlog_values_are_consistent_with_vtrace_on_a_toy_chain() -> None:
    hp = APPOHyperparams(gamma=0.9, c_bar=0.95, normalize_advantages=False)
    exact = true_values(0.9)
    seen: dict[str, torch.Tensor] = {}
    _, stats = appo_loss(**toy_chain(), values=symlog(exact), hp=hp, value_transform=ValueTransform("symlog"),
                         on_targets=lambda vs, m: seen.update(vs=vs))
    torch.testing.assert_close(seen["vs"], exact[:-1])  # V-trace reads symexp(head) = the true values
    assert float(stats["value_loss"]) < 1e-10
    _, plain = appo_loss(**toy_chain(), values=symlog(exact), hp=hp)  # the same head read as V: wrong
    assert float(plain["value_loss"]) > 1.0


def test_config_fields_for_the_learner(monkeypatch: pytest.MonkeyPatch) -> None:
    words = ["--env", "CartPole-v1", "--normalize-returns", "--value-transform", "symlog"]
    cfg = parse_command_line(words).config
    assert cfg.normalize_returns and cfg.value_transform == "symlog"
    default = parse_command_line(["--env", "CartPole-v1"]).config
    assert not default.normalize_returns and default.value_transform == "none"
    default.validate()
    if not config.VALUE_SCALING_IN_LEARNER:  # refused, not silently ignored, until the learner applies them
        with pytest.raises(ConfigError, match="not applied by this version's learner"):
            cfg.validate()
    monkeypatch.setattr(config, "VALUE_SCALING_IN_LEARNER", True)
    cfg.validate()
