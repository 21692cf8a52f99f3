"""Memory through the real engine: a cue at an episode's first step, the question at its last (tests/memory_envs.py).

Episodes (12 steps) are longer than the slots (--rollout 8), so every episode crosses a slot boundary between
its cue and its question: a feed-forward policy stays at chance (0.5), and a recurrent one can answer only if
its state is carried across slots, by the policy workers and by the learner from each slot's stored initial
state. That the two agree on every state is checked exactly below.

The learning tests train --rnn gru and --rnn lstm on the same task with 16-step slots: episodes start at every
phase of a slot (16 is not a multiple of 12), so some keep their cue and question in one slot and most cross a
boundary, where only the carried state holds the cue. The clock input is off there (`{"clock": false}`), so
the core sees nothing between cue and question.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import launcher
from tests.roles import fork_roles, stop_roles

TESTS = os.path.dirname(os.path.abspath(__file__))
COMMON = ["--env", "memory_envs:make_cue", "--rollout", "8", "--report-interval", "1", "--device", "cpu"]
CHANCE = 0.5  # a right answer pays 1, a wrong one 0; without the cue, a policy answers at random
FEED_FORWARD_FRAMES = 20_000


def train(train_dir: Path, name: str, *args: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    proc = launcher.run("train", [*COMMON, "--train-dir", str(train_dir), "--experiment", name, *args], timeout=400,
                        env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = (train_dir / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("episode_return_mean") is not None]


SOLVED = 0.9  # the bar: 90% of the maximum return (1)
# asyncrl.train() in a script: the run stops once the 100-episode mean reaches STOP (else at the budget).
LEARN_SCRIPT = """
import sys

import asyncrl


first = []  # env steps of the first record at the bar


def held(record):
    # go on until the mean has been at the bar for HOLD env steps (or --frames)
    if record["event"] != "metrics":
        return True
    if not first and (record.get("episode_return_mean") or 0) >= {stop}:
        first.append(record["env_steps"])
    return not (first and record["env_steps"] - first[0] >= {hold})


asyncrl.train(env="memory_envs:make_cue", env_kwargs='{{"clock": false}}', rollout=16, rnn=sys.argv[2],
              rnn_size=64, lr=1e-3, lr_schedule="auto", entropy_coeff=0.01, frames=int(sys.argv[3]),
              report_interval=1, device="cpu", train_dir=sys.argv[1], experiment=sys.argv[2], callbacks=[held])
"""
# Budgets in env steps, measured: the 100-episode mean first reached 0.9 at GRU: 11.3k, 11.5k, 12.3k, 13.0k, 14.1k
# and 16.1k (six runs, 2026-12-05, the update gates' bias starting at 1; at torch's 0 eight runs took 12.1k-62.7k and
# a fresh-clone CI run stayed at 0.56 within 60k), LSTM: 5.7k-6.6k. Chance (a feed-forward policy, or no memory
# across slots) is 0.5. A run goes on for HOLD env steps once solved and must end at HELD or above, never falling to
# FLOOR on the way: it keeps what it learned. The rate decays linearly to 0 at the budget (`auto`, the vector
# preset's schedule): at a constant 1e-3 the LSTM, run on for 25k env steps once solved, fell below 0.7 in 7 of 41
# runs and stayed at chance in 2 (a fresh-clone CI run fell to 0.70); with the decay over 60k, 0 of 20 fell below
# 0.78, and the GRU held 0.88 or above in 5 of 5 (2026-12-08, three runs at a time on the 2 cores).
LEARN_FRAMES = {"gru": 60_000, "lstm": 30_000}
HOLD, HELD, FLOOR = 5_000, 0.8, 0.65


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_a_recurrent_policy_remembers_the_cue(core: str, tmp_path: Path) -> None:
    script = tmp_path / "learn.py"
    script.write_text(LEARN_SCRIPT.format(stop=SOLVED, hold=HOLD))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    proc = launcher.run(f"{launcher.SCRIPT}{script}", [str(tmp_path), core, str(LEARN_FRAMES[core])], cwd=tmp_path,
                        env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = (tmp_path / core / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r.get("episode_return_mean") is not None]
    returns = [r["episode_return_mean"] for r in records]
    assert returns and max(returns) >= SOLVED, f"--rnn {core} stayed at {max(returns or [0]):.2f}"
    start = next(i for i, r in enumerate(returns) if r >= SOLVED)
    after = records[start:]
    assert after[-1]["env_steps"] - after[0]["env_steps"] >= HOLD, (after[0]["env_steps"], after[-1]["env_steps"])
    kept = [round(r, 2) for r in returns[start:]]
    print(f"\n--rnn {core}: {SOLVED} at {after[0]['env_steps']:,} env steps, then {kept}")
    # held to the end, and never back near chance on the way (one fresh-clone CI run dipped to 0.77 from 0.9)
    assert returns[-1] >= HELD and min(kept) >= FLOOR, f"--rnn {core} reached {SOLVED}, then {kept}"


def disjoint_windows(records: list[dict], window: int = 100) -> list[float]:
    """The 100-episode means of records whose windows share no episode, newest first: consecutive records'
    windows overlap when the machine is slow and few episodes end between reports."""
    means, last = [], None
    for record in reversed(records):
        if record["episodes"] >= window and (last is None or last - record["episodes"] >= window):
            means.append(record["episode_return_mean"])
            last = record["episodes"]
    return means


def test_a_feed_forward_policy_stays_at_chance(tmp_path: Path) -> None:
    """The issue's bar, at most chance + 0.1, read from enough episodes that chance never reaches it: the 100-episode
    means of records whose windows share no episode. A fresh-clone run that averaged the last five records failed
    at 0.60: few episodes had ended between its reports, so the five windows were nearly one (deviation 0.05)."""
    # Records every 0.2 s, and the workers report as often: a quiet 2-core machine runs the 20k env steps (1,666
    # episodes) in 2-3 s, whose records held 10-12 disjoint windows in three runs.
    records = train(tmp_path, "ff", "--frames", str(FEED_FORWARD_FRAMES), "--report-interval", "0.2")
    assert records[-1]["env_steps"] >= FEED_FORWARD_FRAMES
    means = disjoint_windows(records)
    # At chance the mean of n windows deviates by 0.5 / sqrt(100 n): the bar is 4 deviations above chance for 4
    # windows, 4.5 for 5, 6.3 for 10.
    assert len(means) >= 4, [(r["episodes"], r["episode_return_mean"]) for r in records]
    assert sum(means) / len(means) <= CHANCE + 0.1, means


@pytest.mark.parametrize("core", ["gru", "lstm"])
def test_the_learner_re_runs_exactly_the_states_the_policy_worker_acted_from(core: str) -> None:
    """The real policy worker and rollout worker (forked) fill consecutive slots with a recurrent policy whose weights
    never change: the learner's re-run of each slot from its stored initial state, reset where `first` is set,
    gives every acted step's log-probability exactly. It differs wherever acting and learning disagree on the
    state: a policy worker that does not reset it at episode starts, one that resets it at a slot boundary (or a
    rollout worker that does not hand row T over), a `first` flag written at the wrong step."""

    import numpy as np
    import torch

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.agents.batch import gather_batch
    from asyncrl.envs.registry import make_env_spec
    from asyncrl.resolve import config_from_flags
    from asyncrl.runtime.plumbing.wiring import build_wiring
    from asyncrl.runtime.roles.learner import WeightsPublisher

    cfg = config_from_flags(env="memory_envs:make_cue", rnn=core, rnn_size=16, workers=1, envs_per_worker=4,
                            worker_splits=1, rollout=8, batch_size=32, device="cpu", train_dir="/tmp")
    spec = make_env_spec(cfg)
    wiring = build_wiring(cfg, spec)
    torch.manual_seed(0)
    learner = APPOLearner(cfg, spec, torch.device("cpu"))
    WeightsPublisher(learner.policy_module(), wiring.weights[0]).publish(1)
    children = fork_roles(wiring, ("policy-0", "rollout-0"))
    taken: list[dict[str, np.ndarray]] = []  # one env split: consecutive slots, copied out as the learner would
    try:
        for _ in range(4):
            slot = wiring.channels.full.get(timeout=60)
            taken.append({k: a[slot].copy() for k, a in wiring.traj.items()})
            wiring.channels.free.put(slot)
    finally:
        stop_roles(wiring, children)
    traj = {k: np.stack([s[k] for s in taken]) for k in taken[0]}
    assert (traj["versions"] == 1).all()
    first = traj["first"]
    assert first[:, 1:].any() and not first[1:, 0].all()  # episodes start inside slots and run across them
    assert np.abs(traj["state/h"][1:, 0]).max() > 0  # later slots start from a carried state
    batch = gather_batch(traj, np.arange(len(taken)), 1, torch.device("cpu"))
    model = learner.model.eval()
    with torch.no_grad():
        policy_out, _, _ = model.unroll(batch.obs, batch.first, batch.initial_state)
        t, b = batch.rewards.shape
        dist = model.distribution(policy_out[:t].flatten(0, 1))
        logp = dist.log_prob(batch.actions.reshape(t * b, *spec.action_shape)).reshape(t, b)
    torch.testing.assert_close(logp, batch.behaviour_logp, atol=1e-5, rtol=0)
