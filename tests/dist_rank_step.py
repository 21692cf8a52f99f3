"""One rank of an in-process data-parallel check: `python -m tests.dist_rank_step RANK PORT OUT_DIR`.

Two of these, started by tests/test_distributed.py, form a real 2-rank gloo group through the learner's own hooks
(`for_this_rank`, `join_group`, the group's `average_gradients` and `agree`) around a real APPO learner on hand-made
batches: each rank trains on its own data, records its gradients before and after every all-reduce, and writes
what it saw to OUT_DIR/rank<RANK>.pt for the test to compare.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from asyncrl.agents.appo.learner import APPOLearner
from asyncrl.agents.batch import Batch
from asyncrl.config import Config
from asyncrl.envs.null_env import NULL_SPEC
from asyncrl.runtime.distributed.group import join_group
from asyncrl.runtime.distributed.rank import ENV_STEPS as STEPS_WORD
from asyncrl.runtime.distributed.rank import EPISODES as EPISODES_WORD
from asyncrl.runtime.distributed.rank import GROUP_EPISODES, for_this_rank

T, B = 6, 8  # steps x envs of each rank's batches
ENV_STEPS = (1000, 2500)  # what each rank's runner has counted, published on its board before the agreement
EPISODES = (7, 11)
LR = (1e-3, 3e-3)  # each rank's learning rate before the agreement (the kl rule can move them apart)


def make_batch(seed: int, nan_rewards: bool = False) -> Batch:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, B, generator=g)
    if nan_rewards:
        rewards[:] = float("nan")
    return Batch(obs=torch.randn(T + 1, B, 4, generator=g), actions=torch.randint(0, 2, (T, B), generator=g),
                 behaviour_logp=torch.full((T, B), -0.69) + 0.1 * torch.randn(T, B, generator=g), rewards=rewards,
                 terminated=torch.rand(T, B, generator=g) < 0.1, truncated=torch.zeros(T, B, dtype=torch.bool),
                 final_obs=torch.zeros(B, 4), final_step=torch.full((B,), -1), lag=torch.zeros(T, B, dtype=torch.long))


def params(learner: APPOLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.model.parameters()]


def main(rank: int, port: int, out_dir: Path) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    given = Config(env="null", device="cpu", minibatches=2, epochs=2, lr_schedule="constant", normalize_obs=True,
                   train_dir=str(out_dir / "train"), experiment="g", dist_timeout=60.0, learner_threads=1)
    cfg, ranks = for_this_rank(given)  # this rank's seed, run dir and the runner's board
    assert ranks is not None
    ranks.announce(cfg)
    torch.manual_seed(cfg.seed)  # rank 1's seed differs, so its initial weights do
    learner = APPOLearner(cfg, NULL_SPEC, torch.device("cpu"))
    record: dict = {"before_join": params(learner)}
    # What the learner process's channels show the hooks once the run is stopping: a failure ends the rank at once
    # (no runner to report to) and the agreed stop waits for nothing.
    channels = SimpleNamespace(stopping=True)
    group = join_group(ranks, learner, channels)
    record["after_join"] = params(learner)

    steps: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def recording_sync(model: torch.nn.Module, loss: torch.Tensor) -> None:
        local = [p.grad.detach().clone() for p in model.parameters()]
        group.average_gradients(model, loss)
        steps.append((local, [p.grad.detach().clone() for p in model.parameters()]))

    learner.sync_gradients = recording_sync
    learner.train(make_batch(seed=rank), frames=0)
    record.update(steps=list(steps), after_train=params(learner), local_trained=learner.samples_trained)
    learner.lr = LR[rank]
    board = ranks.board
    board[STEPS_WORD], board[EPISODES_WORD] = ENV_STEPS[rank], EPISODES[rank]
    stats: dict = {}
    group.agree(learner, stats, channels)
    norm = learner.model.obs_normalizer
    record.update(group_env_steps=stats["group_env_steps"], ranks=stats["ranks"],
                  samples_trained=learner.samples_trained, lr=learner.lr,
                  group_episodes=int(board[GROUP_EPISODES]),
                  obs_count=float(norm.count), obs_mean=norm.mean.clone())
    # Rank 1's loss is NaN: every rank's gradients become NaN, so both skip all of this batch's steps.
    learner.train(make_batch(seed=10 + rank, nan_rewards=rank == 1), frames=0)
    record.update(after_nan=params(learner), nonfinite_updates=learner.nonfinite_updates,
                  nan_steps=len(steps) - len(record["steps"]))
    torch.save(record, out_dir / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
