"""The preflight (`asyncrl.preflight`): `--print-config` runs the run's checks and refuses in one line what a run
would refuse; a start makes the env's spec once; --resume's change lines come from the config.json that resolving
the settings read."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncrl.config import Config
from asyncrl.resolve import parse_command_line, resume_changes
from asyncrl.spec_memo import EnvSpecs
from tests.conftest import run_cli
from tests.train_cli import assert_user_error

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--workers", "1", "--envs-per-worker", "2", "--rollout", "8", "--batch-size", "16", "--minibatches", "1",
        "--epochs", "1"]


@pytest.mark.parametrize("args, fragments", [
    (["--env", "CartPol-v1"], ["unknown env 'CartPol-v1'"]),
    (["--env", "CartPole-v1", "--algo", "sac"], ["--algo sac needs continuous (Box) actions", "Discrete"]),
    (["--env", "CartPole-v1", "--resume", "--experiment", "nothing"], ["--resume", "no checkpoint", "nothing"]),
], ids=["unknown-env", "sac-on-discrete", "resume-nothing"])
def test_print_config_refuses_what_a_run_refuses(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    train_dir = tmp_path / "runs"
    result = run_cli([*args, "--print-config"], train_dir, timeout=60, fresh=True)
    assert_user_error(result, *fragments)
    assert result.stdout == "" and not train_dir.exists()


def test_print_config_prints_a_good_config_and_creates_nothing(tmp_path: Path) -> None:
    train_dir = tmp_path / "runs"
    result = run_cli(["--env", "CartPole-v1", *TINY, "--print-config"], train_dir, timeout=60, fresh=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["env"] == "CartPole-v1" and result.stderr == ""
    assert not train_dir.exists()


COUNTING = """
import json, sys
import asyncrl.envs.registry as registry

made = []
real = registry.make_env_spec

def counting(*args, **kwargs):
    made.append(1)
    return real(*args, **kwargs)

registry.make_env_spec = counting  # before the launcher and the runner import it
{body}
print(json.dumps({{"made": len(made)}}))
"""

TRAIN = """
import asyncrl

asyncrl.train(env="CartPole-v1", frames=64, workers=1, envs_per_worker=2, rollout=8, batch_size=16, minibatches=1,
              epochs=1, report_interval=100.0, train_dir=sys.argv[1])
"""

PRINT_CONFIG = """
from asyncrl.cli.train import main

assert main(["--env", "CartPole-v1", "--train-dir", sys.argv[1], "--print-config"]) == 0
"""


@pytest.mark.parametrize("body", [TRAIN, PRINT_CONFIG], ids=["train", "print-config"])
def test_a_start_makes_the_env_spec_once(tmp_path: Path, body: str) -> None:
    script = COUNTING.format(body=textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "runs")], capture_output=True, text=True,
                          cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"made": 1}


def test_spec_memo_makes_each_env_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncrl.envs.registry as registry

    made: list[str] = []
    real = registry.make_env_spec
    monkeypatch.setattr(registry, "make_env_spec", lambda cfg: made.append(str(cfg)) or real(cfg))
    specs = EnvSpecs()
    first = specs.get(Config(env="CartPole-v1"))
    assert specs.get({"env": "CartPole-v1", "env_kwargs": {}, "env_vectorization": "auto"}) is first
    assert specs.get({"env": "CartPole-v1", "seed": 3}) is first  # a setting the env's backend does not read
    specs.get({"env": "CartPole-v1", "env_vectorization": "loop"})  # one it reads: a spec of its own
    for _ in range(2):
        with pytest.raises(Exception, match="unknown env"):
            specs.get({"env": "CartPol-v1"})
    assert len(made) == 3  # the unknown env's error was kept, not made again


def test_resume_changes_use_the_config_json_resolution_read(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(Config(env="CartPole-v1", frames=1500, experiment="r").to_json())
    command = parse_command_line(["--resume", "--env", "CartPole-v1", "--experiment", "r", "--frames", "3000",
                                  "--train-dir", str(tmp_path)])
    (run_dir / "config.json").unlink()  # read once, while the settings were resolved
    saved = command.resolution.saved
    assert saved is not None and "frames: 1500 -> 3000" in resume_changes(command.config, saved)
