"""Several policies at once (--num-policies) and population-based training (--pbt), through asyncrl-train.

The cue task of `tests.multi_agent_envs` (`team: false`: each agent is paid for its own answer) shows which
policy learned what: each agent column is a fixed policy, so a policy that is not allowed to learn (lr 0) stays
at random play (1 of 8) while the others reach 8, unless PBT gives it another's weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import asyncrl
from asyncrl.cli.enjoy import main as enjoy_main
from asyncrl.cli.train import main as train_main
from asyncrl.config import Config, ConfigError
from asyncrl.diagnostics.metrics import read_metrics
from asyncrl.policy import PolicyLoadError
from asyncrl.population.pbt import perturbed, read_events
from asyncrl.resolve import config_from_flags
from asyncrl.runtime.plumbing.policy_map import PolicyMap
from asyncrl.runtime.store.checkpoint import load_latest_checkpoint
from tests.conftest import run_cli

MATCH = ["--env", "tests.multi_agent_envs:match", "--env-kwargs", '{"team": false}', "--workers", "1",
         "--envs-per-worker", "12", "--rollout", "8", "--batch-size", "192", "--minibatches", "2", "--epochs", "2",
         "--lr", "0.01",
         "--report-interval", "1"]


def last(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return values[-1] if values else None


def test_each_policy_has_its_own_weights_and_learns_alone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Three policies, agent k -> policy k; policy 2 trains at lr 0 and must stay at chance.

    7k env steps: three runs on a machine loaded about 3.5x ended with policies 0 and 1 at 7.51-7.76 (policy 2:
    0.95-1.02), their greedy policies answering 8 of the 8 cues (policy 2: 0); at 8k, 7.69-7.86 there (loaded about
    10x, 7.82-7.97, both >= 6.0 from 3.5-3.9k on). At 6k they ended at 6.91-7.46 loaded 3.5x: too close to 6.0."""
    proc = run_cli([*MATCH, "--num-policies", "3", "--policy-settings", '[{}, {}, {"lr": 0}]', "--frames", "7000",
                    "--experiment", "three"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "three")
    learned = [last(records, f"policy_{p}/episode_return_mean") for p in range(3)]
    assert learned[0] >= 6.0 and learned[1] >= 6.0, learned
    assert learned[2] <= 2.5, f"policy 2 never trains (lr 0), its agent plays at chance: {learned}"
    assert last(records, "policy_2/lr") == 0.0 and last(records, "policy_0/lr") == 0.01
    assert all(last(records, f"policy_{p}/policy_version") > 3 for p in range(3))
    _, state = load_latest_checkpoint(str(tmp_path / "three"))
    assert len(state["policies"]) == 2 and state["policy_settings"][2]["lr"] == 0.0
    # Each policy loads on its own: the learned ones answer the cue, policy 2 does not.
    cues = np.eye(8, dtype=np.float32)
    for p, solved in ((0, True), (1, True), (2, False)):
        policy = asyncrl.load_policy(str(tmp_path / "three"), policy=p)
        hits = int((policy(cues) == np.arange(8)).sum())
        assert (hits >= 7) == solved, (p, hits)
    with pytest.raises(PolicyLoadError, match="holds 3 policies"):
        asyncrl.load_policy(str(tmp_path / "three"), policy=3)
    # asyncrl-enjoy plays one policy in every seat: --policy 2 guesses (policies 0 and 1 would score 7-8 there).
    # (asyncrl-enjoy's main, in this process: the policy and the env load here already)
    assert enjoy_main([str(tmp_path / "three"), "--policy", "2", "--episodes", "6"]) == 0
    out = capsys.readouterr().out
    mean = float(out.split("raw score mean ")[1].split(",")[0])
    assert 0 <= mean <= 4, out
    # The population resumes: every policy's version goes on from where it stopped.
    versions = [last(records, f"policy_{p}/policy_version") for p in range(3)]
    # The first run stops past its budget by however far the workers got while it stopped (further on a quiet
    # machine: a fresh-clone run of 8k got past 10k), so the resumed budget counts from where it ended.
    budget = max(9_000, records[-1]["env_steps"] + 2_000)
    proc = run_cli([*MATCH, "--num-policies", "3", "--policy-settings", '[{}, {}, {"lr": 0}]', "--frames",
                    str(budget), "--experiment", "three", "--resume"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    resumed = read_metrics(tmp_path / "three")[len(records):]
    assert all(last(resumed, f"policy_{p}/policy_version") > versions[p] for p in range(3)), versions


def test_pbt_replaces_a_policy_that_cannot_learn(tmp_path: Path) -> None:
    """Two policies, policy 1 at lr 0: PBT copies policy 0 into it and it plays well from then on.

    10k frames (two rounds): three runs on a machine loaded about 10x scored [7.73-7.94, 0.94-1.05] at the first
    round (4.0-4.1k), exploited policy 0 into policy 1 there, and ended with policy 1 at 7.98-8.0. (7k frames with
    a round every 3k passed 3 runs loaded about 8x but failed 3 of 3 on a quieter machine: policy 1 at 1.0-5.8.)"""
    proc = run_cli([*MATCH, "--num-policies", "2", "--policy-settings",
                    '[{}, {"lr": 0}]', "--pbt", "--pbt-period", "4000", "--pbt-fraction", "0.5", "--frames", "10000",
                    "--eval-every", "8000", "--eval-episodes", "2", "--experiment", "pbt"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = read_events(str(tmp_path / "pbt"))
    assert [e for e in events if e["event"] == "round"], events
    exploits = [e for e in events if e["event"] == "exploit"]
    assert exploits and exploits[0]["policy"] == 1 and exploits[0]["from"] == 0, events
    assert exploits[0]["settings_before"]["lr"] == 0.0 and exploits[0]["settings"]["lr"] > 0
    records = read_metrics(tmp_path / "pbt")
    assert last(records, "policy_1/episode_return_mean") >= 6.0, "the copied policy plays as well as its source"
    evals = [r["eval_return_mean"] for r in records if r.get("eval_return_mean") is not None]
    assert evals, "the evaluator plays policy 0 in every seat of the multi-agent env"
    into_1 = [e for e in exploits if e["policy"] == 1]
    assert last(records, "policy_1/lr") == pytest.approx(into_1[-1]["settings"]["lr"])


def test_self_play_wins_against_its_early_snapshots(tmp_path: Path) -> None:
    """A zero-sum duel: the learning seat soon beats the pool of first weights; the snapshots' own episodes are
    neither trained on nor reported (one learning seat of two: half the agent-episodes).

    The pool keeps the first weights for the whole run (a snapshot every 1,000 versions; the run makes about 70):
    with a snapshot every 10 versions the pool catches up and the rate falls back towards 0.5, so a quiet machine,
    which writes few records, could miss the early peak (a fresh-clone run read [0.73] against a bar of 0.8).
    Against its first weights the learner won 0.99-1.0 of its last 100 games in 3 runs of 5,000 env steps on a
    machine loaded about 3.5x (at 4,000: 0.975-1.0 there; loaded about 8x, past 0.9 from 2.3-2.7k on; at 6,000: 1.0
    in 3 runs of 6,900-9,300 env steps); chance is 0.5 (the first weights against themselves)."""
    proc = run_cli(["--env", "tests.multi_agent_envs:duel", "--self-play", "--self-play-every", "1000", "--workers",
                    "1", "--envs-per-worker", "16", "--rollout", "8", "--batch-size", "128", "--minibatches", "2",
                    "--epochs", "2", "--lr", "0.01", "--frames", "5000", "--report-interval", "1",
                    "--experiment", "duel"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_metrics(tmp_path / "duel")
    rates = [r["win_rate"] for r in records if r.get("win_rate") is not None]
    assert rates and rates[-1] >= 0.9, rates
    end = records[-1]
    assert 0.85 <= end["episodes"] * 8 * 2 / end["env_steps"] <= 1.05, (end["episodes"], end["env_steps"])

    # The pool is checkpointed and resumed as it was: the resumed learner still plays its first weights (and beats
    # them), where a pool started again from the resumed weights would be a mirror match (0.5). The budget counts
    # from where the first run ended (a quiet machine overshoots).
    _, saved = load_latest_checkpoint(str(tmp_path / "duel"))
    pool = saved["self_play_pool"]
    assert pool["versions"] == [1] * 8, pool["versions"]  # every snapshot is still the first weights
    proc = run_cli(["--env", "tests.multi_agent_envs:duel", "--frames", str(end["env_steps"] + 1500),
                    "--report-interval", "0.5", "--experiment", "duel", "--resume"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the pool of 8 snapshots resumed as it was saved" in proc.stdout, proc.stdout[-2000:]
    resumed = [r["win_rate"] for r in read_metrics(tmp_path / "duel")[len(records):] if r.get("win_rate") is not None]
    assert resumed and min(resumed) >= 0.8, resumed
    _, again = load_latest_checkpoint(str(tmp_path / "duel"))
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(again["self_play_pool"]["weights"],
                                                                     pool["weights"]))


def test_fixed_random_and_self_play_policy_maps() -> None:
    cfg = Config(env="CartPole-v1", workers=2, envs_per_worker=6, worker_splits=2, num_policies=2)
    fixed = PolicyMap(cfg, worker=1)  # global columns 6..11
    row = np.zeros(3, np.int8)
    fixed.write(1, row, np.ones(3, bool))
    assert row.tolist() == [1, 0, 1] and fixed.of(1, 1) == 0
    rand = PolicyMap(Config(env="CartPole-v1", workers=1, envs_per_worker=64, worker_splits=1, num_policies=4,
                            policy_mapping="random"), worker=0)
    first = np.zeros(64, bool)
    before = rand.current[0].copy()
    rand.write(0, np.zeros(64, np.int8), first)
    assert (rand.current[0] == before).all(), "no episode starts: the policies stay"
    first[:32] = True
    rand.write(0, np.zeros(64, np.int8), first)
    assert (rand.current[0][32:] == before[32:]).all() and set(rand.current[0].tolist()) == {0, 1, 2, 3}


def test_pbt_copies_a_recurrent_policy_whole() -> None:
    """With --rnn, PBT's exploit step takes the source's core with the rest: the copy acts as the source does over
    a sequence, state for state, and its version moves past both."""
    import torch

    from asyncrl.agents.appo.learner import APPOLearner
    from asyncrl.envs.registry import make_env_spec

    cfg = config_from_flags(env="CartPole-v1", rnn="gru", rnn_size=16, num_policies=2, pbt=True)
    spec = make_env_spec(cfg)
    torch.manual_seed(0)
    source = APPOLearner(cfg, spec, torch.device("cpu"))
    torch.manual_seed(1)
    copy = APPOLearner(cfg, spec, torch.device("cpu"))
    source.version, copy.version = 7, 3
    assert not torch.equal(source.model.state_dict()["core.rnn.weight_hh_l0"],
                           copy.model.state_dict()["core.rnn.weight_hh_l0"])
    copy.adopt(source)
    assert copy.version == 8
    mine, theirs = copy.model.state_dict(), source.model.state_dict()
    assert any(k.startswith("core.") for k in mine) and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    obs = torch.randn(6, 4, *spec.obs_shape)
    states = [{k: torch.zeros(4, *shape) for k, (shape, _) in m.state_layout().items()}
              for m in (copy.model, source.model)]
    with torch.no_grad():
        for t in range(6):
            (a, _, states[0]), (b, _, states[1]) = (m.step(obs[t], s, None) for m, s in zip((copy.model,
                                                                                           source.model), states))
            assert torch.equal(a, b) and all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_perturbation_moves_each_setting_by_the_factor() -> None:
    import random

    out = perturbed({"lr": 1e-3, "entropy_coeff": 0.01, "clip_ratio": 0.1, "gamma": 0.99}, random.Random(0))
    for key, value in (("lr", 1e-3), ("entropy_coeff", 0.01), ("clip_ratio", 0.1)):
        assert out[key] == pytest.approx(value * 1.2) or out[key] == pytest.approx(value / 1.2)
    assert out["gamma"] in (pytest.approx(1 - 0.01 * 1.2), pytest.approx(1 - 0.01 / 1.2))


@pytest.mark.parametrize("flags, message", [
    (["--num-policies", "0"], "--num-policies must be at least 1"),
    (["--pbt"], "--pbt needs a population: set --num-policies 2 or more"),
    (["--num-policies", "2", "--policy-settings", "[{}]"], "--policy-settings must be a JSON list of 2 objects"),
    (["--num-policies", "2", "--policy-settings", '[{"momentum": 1}, {}]'], "--policy-settings sets 'momentum'"),
    (["--num-policies", "2", "--policy-mapping", "round"], "--policy-mapping must be fixed or random"),
    (["--self-play"], "--self-play seats a learning policy against snapshots in a multi-agent env"),
])
def test_bad_population_settings_stop_in_one_line(flags: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # asyncrl-train's main, in this process: refused before anything starts
    code = train_main(["--env", "CartPole-v1", *flags, "--frames", "1000", "--train-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    assert not list(tmp_path.rglob("*")), "bad input must leave nothing written"


def test_multi_agent_envs_and_populations_refuse_the_off_policy_learners(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = train_main(["--env", "tests.multi_agent_envs:match", "--algo", "sac", "--frames", "1000", "--train-dir",
                       str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "trains single-agent envs" in err, err
    with pytest.raises(ConfigError, match="--num-policies"):
        config_from_flags(env="Pendulum-v1", algo="sac", num_policies=2)
    duel = PolicyMap(Config(env="duel", workers=1, envs_per_worker=8, worker_splits=1, self_play=True,
                            self_play_pool=4), worker=0, agents=2)
    seats = duel.current[0].reshape(4, 2)
    assert ((seats == 0).sum(axis=1) == 1).all() and ((seats >= 1) & (seats <= 4)).sum() == 4, seats
    first = np.array([True, True, True, False, False, False, False, False])  # instance 0 ends; 1 has one agent out
    kept = duel.current[0][2:].copy()
    for _ in range(20):
        duel.write(0, np.zeros(8, np.int8), first)
    assert (duel.current[0][2:] == kept).all(), "an instance is seated again only when all its agents start over"
