"""Every script in examples/ runs, with a budget of a few hundred env steps, and leaves what it promises."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launcher

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """`args` to completion: `python EXAMPLE ...` as a fork of the tests' warm interpreter (tests/launcher.py),
    anything else as a process of its own."""
    env = {**os.environ, **(env or {})}
    if args[0] == sys.executable:
        result = launcher.run(f"{launcher.SCRIPT}{args[1]}", args[2:], cwd=cwd, env=env, timeout=240)
    else:
        result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, f"{args} -> {result.returncode}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
    return result.stdout


def test_every_example_has_a_test() -> None:
    tested = {"custom_env.py", "sac_mujoco.py", "two_ranks.sh", "compare_seeds.py", "env_hooks.py", "python_api.py",
              "coop_signal.py"}
    assert {p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh")} == tested


def test_coop_signal_pays_both_agents_only_when_both_pick_the_signal() -> None:
    """examples/coop_signal.py (docs/results.md's reach-and-hold task; the doc recipes train it): 25 steps, +1 to
    both agents when both answer the signal both see, 0 when either does not; two env columns through asyncrl."""
    import importlib.util

    from asyncrl.envs.registry import make_env_spec

    spec = importlib.util.spec_from_file_location("coop_signal", EXAMPLES / "coop_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.make()
    obs, _ = env.reset(seed=3)
    total, steps, done = 0.0, 0, False
    while not done:
        signal = int(obs["agent_0"][:3].argmax())
        assert obs["agent_1"][:3].argmax() == signal and obs["agent_0"][3] == obs["agent_1"][4] == 1.0
        wrong = (signal + 1) % 3
        answer = {"agent_0": signal, "agent_1": signal if steps % 2 == 0 else wrong}
        obs, rewards, _, truncs, _ = env.step(answer)
        assert rewards["agent_0"] == rewards["agent_1"] == (1.0 if steps % 2 == 0 else 0.0)
        total += rewards["agent_0"]
        steps += 1
        done = all(truncs.values())
    assert (steps, total) == (25, 13.0)
    sys.path.insert(0, str(EXAMPLES.parent))
    try:
        assert make_env_spec("examples.coop_signal:make").num_agents == 2
    finally:
        sys.path.remove(str(EXAMPLES.parent))


def test_custom_env_example_trains_and_plays_its_env(tmp_path: Path) -> None:
    out = run([sys.executable, str(EXAMPLES / "custom_env.py"), "--frames", "600"], tmp_path)
    assert "one greedy episode: return" in out
    assert list((tmp_path / "train_dir" / "walk" / "checkpoints").glob("*.pt"))


def test_python_api_example_trains_then_plays_five_episodes(tmp_path: Path) -> None:
    out = run([sys.executable, str(EXAMPLES / "python_api.py"), "--frames", "2000"], tmp_path)
    assert "train_dir/cartpole_api: " in out and " frames, mean return " in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("episode ")] == \
        [f"episode {seed}" for seed in range(5)]
    assert list((tmp_path / "train_dir" / "cartpole_api" / "checkpoints").glob("*.pt"))


def test_env_hooks_example_masks_reports_and_stops(tmp_path: Path) -> None:
    out = run([sys.executable, str(EXAMPLES / "env_hooks.py"), "--frames", "50000", "--goal", "0", "--doors", "3",
               "--report-interval", "1"], tmp_path)  # a record a second: it stops at the first that qualifies
    assert "stopped on callback" in out and "200 greedy steps: 0 closed doors walked into" in out
    assert "depth " in out and "doors open 3.0" in out


def test_sac_mujoco_example_trains_and_evaluates(tmp_path: Path) -> None:
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed (pip install -e '.[mujoco]')")
    out = run([sys.executable, str(EXAMPLES / "sac_mujoco.py"), "--frames", "300", "--learning-starts", "200"],
              tmp_path)
    assert "stopped on frames" in out and "one greedy episode of" in out
    config = json.loads((tmp_path / "train_dir" / "sac_HalfCheetah-v5_seed0" / "config.json").read_text())
    assert (config["algo"], config["env"]) == ("sac", "HalfCheetah-v5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_example_runs_both_ranks(tmp_path: Path) -> None:
    bin_dir = str(ROOT / ".venv" / "bin") if (ROOT / ".venv" / "bin" / "torchrun").exists() else \
        str(Path(sys.executable).parent)
    # TMPDIR: torchrun's own log directory (a new /tmp/torchelastic_* at each launch) lands in the test's
    run([str(EXAMPLES / "two_ranks.sh"), "--frames", "600"], tmp_path,
        {"BIN": bin_dir, "PORT": str(free_port()), "TMPDIR": str(tmp_path)})
    run_dir = tmp_path / "train_dir" / "two_ranks"
    ranks = [json.loads(line).get("ranks") for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 2 in ranks and (run_dir / "rank1").is_dir()


def test_compare_seeds_example_writes_the_comparison(tmp_path: Path) -> None:
    out = run([sys.executable, str(EXAMPLES / "compare_seeds.py"), "--frames", "4000", "--seeds", "0"], tmp_path)
    assert "IQM" in out and "P(A>B)" in out
    summary = json.loads((tmp_path / "runs" / "compare" / "summary" / "summary.json").read_text())
    assert summary
