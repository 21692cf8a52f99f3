"""Env metrics (`info["episode_extra_stats"]`, `--info-keys`) and curricula (`set_training_info`) in a real run."""

from __future__ import annotations

import os
import subprocess

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from asyncrl.diagnostics.metrics import read_metrics
from tests import launcher

TESTS = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--workers", "2", "--envs-per-worker", "4", "--batch-size", "256", "--report-interval", "1",
         "--device", "cpu"]
# A 2-action bandit in 10-step episodes: a run reached right_share 0.96 at 4.4k env steps and its level 9 at 7.3k
# (random: right_share 0.5, level about 5). Beside a busy loop on a machine loaded 5-16x, six runs of 10k (the
# rate decays to 0 at --frames) kept right_share above 0.9 from 4.0-4.9k env steps on and the level at 8 or more
# from 4.2-6.0k on, three of 12k from 3.9-4.5k and 4.4-5.2k on, all ending at 1.0 and levels 9-10; 12k leaves
# twice the room of the latest of them.
FRAMES = 12_000


def train(train_dir, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}
    return launcher.run("train", ["--train-dir", str(train_dir), "--experiment", "run", *SMALL, *args], timeout=300,
                        env=env)


@pytest.fixture(scope="module")
def hooked_dir(tmp_path_factory) -> str:
    train_dir = tmp_path_factory.mktemp("hooks")
    # Records every 0.25 s, so the first one comes after a few hundred env steps (two or three updates), before
    # the policy has learned: at 1 s a run on an idle machine had already reached 0.86 in its first record.
    proc = train(train_dir, "--env", "hook_envs:make_right_steps", "--info-keys", "rights", "--frames", str(FRAMES),
                 "--report-interval", "0.25")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(train_dir, "run")


@pytest.fixture(scope="module")
def hooked_run(hooked_dir: str) -> list[dict]:
    return read_metrics(hooked_dir)


# The same env acted by the first weights only (--no-train): a baseline that does not depend on when the trained
# run's first record comes (on a quiet machine its policy had learned by then: a first share of 0.8). Measured:
# right_share 0.486-0.506 and level 0-2.2 over its records (the level rises towards the random return, 5).
UNTRAINED_FRAMES = 8_000


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory) -> list[dict]:
    train_dir = tmp_path_factory.mktemp("untrained")
    proc = train(train_dir, "--env", "hook_envs:make_right_steps", "--frames", str(UNTRAINED_FRAMES), "--no-train",
                 "--report-interval", "0.25")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(os.path.join(train_dir, "run"))


def test_env_metrics_follow_the_learned_policy(hooked_run: list[dict], untrained_run: list[dict]) -> None:
    records = [r for r in hooked_run if "info_right_share" in r]
    assert len(records) >= 3
    # A random policy picks right half the time (the untrained run's 100-episode means); the trained one nearly
    # always.
    untrained = [r["info_right_share"] for r in untrained_run if "info_right_share" in r]
    assert untrained and untrained[-1] < 0.8, untrained
    assert records[-1]["info_right_share"] > 0.9, [r["info_right_share"] for r in records]
    for r in records:  # --info-keys rights at the episode's end: the episode's return, over the same 100 episodes
        assert r["info_rights"] == pytest.approx(r["episode_return_mean"], abs=1e-9)
        assert r["info_right_share"] == pytest.approx(r["episode_return_mean"] / 10, abs=1e-9)


def test_a_curriculum_env_gets_the_runs_progress_and_its_level_rises(hooked_run: list[dict],
                                                                       untrained_run: list[dict]) -> None:
    levels = [r["info_level"] for r in hooked_run if "info_level" in r]
    untrained = [r["info_level"] for r in untrained_run if "info_level" in r]
    # the level follows the mean return: about 5 at random (the untrained run), 8 or more once trained
    assert untrained and untrained[-1] < 7 and levels[-1] >= 8, (untrained, levels)
    # At most once per report interval: no env heard more often than the runner wrote records.
    assert max(r["info_training_infos"] for r in hooked_run if "info_training_infos" in r) <= len(hooked_run)
    assert hooked_run[-1]["info_training_infos"] >= 1


def test_env_metrics_reach_tensorboard_and_asyncrl_plot(hooked_dir: str, tmp_path) -> None:
    tb = os.path.join(hooked_dir, "tb")
    events = [e for f in sorted(os.listdir(tb)) for e in EventFileLoader(os.path.join(tb, f)).Load()]
    tags = {v.tag for e in events if e.HasField("summary") for v in e.summary.value}
    assert {"env/info_right_share", "env/info_rights", "env/info_level"} <= tags
    png = tmp_path / "share.png"  # asyncrl-plot: forks of the warm interpreter, which has imported pyplot
    done = launcher.run("plot", [hooked_dir, "--metric", "info_right_share", "--out", str(png)], timeout=120)
    assert done.returncode == 0 and png.stat().st_size > 1000, done.stderr
    missing = launcher.run("plot", [hooked_dir, "--metric", "info_nothing"], timeout=120)
    assert missing.returncode == 2 and "has no 'info_nothing'" in missing.stderr


@pytest.mark.parametrize("args, message", [
    (["--env", "hook_envs:make_right_steps", "--env-kwargs", '{"text_metric": true}', "--info-keys", "rights"],
     "info['rights'] (--info-keys) is a str, not a number"),
    (["--env", "CartPole-v1", "--info-keys", "a b"], "'a b' is not a key name"),
    (["--env", "atari_pong", "--info-keys", "lives"], "--info-keys applies to gymnasium ids"),
])
def test_bad_env_metrics_are_one_line_exit_2(tmp_path, args: list[str], message: str) -> None:
    proc = train(tmp_path, *args, "--frames", "2000")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
