"""`asyncrl-diagnose RUN --core-state` and `--shots` (the real command, in a process of its own): what a recurrent
policy's encoder and core do over an episode, and where a Doom policy's shots go; misuse is one line, exit 2."""

from __future__ import annotations

import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.runtime.store.checkpoint import save_checkpoint
from tests import launcher
from tests.conftest import run_cli

TINY_GRU = ["--env", "CartPole-v1", "--rnn", "gru", "--rnn-size", "32", "--workers", "1", "--envs-per-worker", "4",
            "--batch-size", "128", "--frames", "2000", "--device", "cpu", "--experiment", "gru"]


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    """`asyncrl-diagnose ARGS` in a process of its own: a fork of the tests' warm interpreter (tests/launcher.py)
    that runs the console script's entry, without paying torch's import again in each of the seven commands."""
    return launcher.run("diagnose", list(args), timeout=180)


def one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("asyncrl-diagnose: error: ") and fragment in result.stderr, result.stderr


@pytest.fixture(scope="module")
def gru_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few thousand env steps of CartPole with a GRU core."""
    train_dir = tmp_path_factory.mktemp("gru")
    proc = run_cli(TINY_GRU, train_dir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return train_dir / "gru"


def test_core_state_of_a_recurrent_run(gru_run: Path) -> None:
    result = diagnose(str(gru_run), "--core-state", "--steps", "50")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{gru_run}: policy version ") and lines[0].endswith(" steps"), lines
    assert lines[1].startswith("  encoder features: RMS ") and "std over the steps" in lines[1], lines
    assert lines[2].startswith("  value: mean ") and len(lines) == 3, lines  # a GRU has no cells to report


def test_misuse_is_one_line(gru_run: Path, tmp_path: Path) -> None:
    one_line_error(diagnose(str(gru_run), "--shots", "--episodes", "1"), "trained CartPole-v1, not a doom_* env")
    one_line_error(diagnose(str(gru_run), "--steps", "5"), "--steps goes with --core-state")
    one_line_error(diagnose(str(gru_run), "--core-state", "--steps", "0"), "--steps must be at least 1")
    one_line_error(diagnose(str(tmp_path / "nope"), "--core-state"), "no run directory")
    plain = tmp_path / "plain"
    plain.mkdir()
    cfg = Config(env="CartPole-v1")
    model = build_model(make_env_spec(cfg.env), cfg.hidden_size, cfg.normalize_obs)
    save_checkpoint(str(plain), 3, {"learner": {"model": model.state_dict(), "version": 3}, "env_steps": 0,
                                    "config": cfg.to_json(), "env": cfg.env}, keep=1)
    one_line_error(diagnose(str(plain), "--core-state"), "is not a recurrent run")


@pytest.mark.skipif(find_spec("vizdoom") is None, reason="vizdoom is not installed (pip install 'asyncrl[doom]')")
def test_shots_of_a_doom_policy(tmp_path: Path) -> None:
    """A fresh model's checkpoint (as tests/test_video.py makes one) plays one episode of defend_the_center: an
    untrained policy dies within some 100 steps."""
    env = "doom_defend_the_center"
    cfg = Config(env=env)
    model = build_model(make_env_spec(env), cfg.hidden_size, cfg.normalize_obs)
    save_checkpoint(str(tmp_path), 3, {"learner": {"model": model.state_dict(), "version": 3}, "env_steps": 0,
                                       "config": cfg.to_json(), "env": env}, keep=1)
    result = diagnose(str(tmp_path), "--shots", "--episodes", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()  # the checkpoint played, as asyncrl-enjoy names it; then the episode
    assert lines[0].endswith("(policy version 3) on doom_defend_the_center"), lines
    assert lines[1].startswith("episode 1: return ") and " missed, " in lines[1], lines
    assert lines[2].startswith("1 episodes (sampled): return mean ") and "misses per episode" in lines[2], lines
    assert lines[3].startswith("  tapped shots ") and lines[4].startswith("  held   shots ") and len(lines) == 5, lines
