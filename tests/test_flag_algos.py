"""Each flag names the --algo values it applies to; given for another algorithm it is refused (one line, exit 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from asyncrl.config import ALGOS, Config, ConfigError, applies_to
from asyncrl.resolve import build_parser, config_from_flags, parse_config
from tests import launcher

PPO_ONLY = ["--normalize-obs", "--max-grad-norm 1", "--lr-schedule kl", "--epochs 2", "--minibatches 1",
            "--clip-ratio 0.2", "--entropy-coeff 0", "--vtrace-c 0.9", "--deterministic", "--scale small",
            "--rnn gru", "--rnn-size 64", "--rnn-layers 2", "--encoder mlp"]


def _argv(flags: str, algo: str) -> list[str]:
    return ["--env", "Pendulum-v1", "--algo", algo, *flags.split()]


@pytest.mark.parametrize("algo", ["sac", "td3", "redq"])
@pytest.mark.parametrize("flags", PPO_ONLY)
def test_ppo_settings_are_refused_for_replay_learners(flags: str, algo: str) -> None:
    name = flags.split()[0]
    with pytest.raises(ConfigError, match=f"^{name} applies to --algo appo only, not {algo}; drop it$"):
        parse_config(_argv(flags, algo))


@pytest.mark.parametrize("flags", ["--tau 0.01", "--utd 2", "--replay-size 1000", "--per", "--learning-starts 10",
                                   "--exploration-noise 0.2"])
def test_replay_settings_are_refused_for_appo(flags: str) -> None:
    with pytest.raises(ConfigError, match="only, not appo; drop it$"):
        parse_config(_argv(flags, "appo"))


def test_exploration_noise_is_td3_only() -> None:
    assert parse_config(_argv("--exploration-noise 0.2", "td3")).exploration_noise == 0.2
    with pytest.raises(ConfigError, match="applies to --algo td3 only, not sac"):
        parse_config(_argv("--exploration-noise 0.2", "sac"))


def test_preset_values_and_applicable_flags_pass() -> None:
    cheetah = parse_config(["--env", "HalfCheetah-v5", "--algo", "sac", "--tau", "0.01", "--lr", "1e-3"])
    assert (cheetah.tau, cheetah.minibatches, cheetah.normalize_obs) == (0.01, 1, False)  # presets set PPO fields
    assert parse_config(_argv("--max-grad-norm 1 --normalize-obs", "appo")).max_grad_norm == 1.0
    with pytest.raises(ConfigError, match="--epochs applies"):
        config_from_flags(env="Pendulum-v1", algo="redq", epochs=2)  # the Python API is checked the same way


def test_config_file_values_are_refused_only_where_they_change_something(tmp_path: Path) -> None:
    saved = dataclasses.asdict(config_from_flags(env="Pendulum-v1", algo="sac"))  # a run's config.json
    path = tmp_path / "run.json"
    path.write_text(json.dumps(saved))
    assert parse_config(["--config", str(path)]).algo == "sac"
    path.write_text(json.dumps({**saved, "epochs": 4}))
    with pytest.raises(ConfigError, match="--epochs applies to --algo appo only, not sac"):
        parse_config(["--config", str(path)])


def test_help_and_the_generated_table_name_the_algorithms() -> None:
    help_text = " ".join(build_parser().format_help().split())
    assert "--algo appo only" in help_text and "--algo sac, td3, redq only" in help_text
    table = (Path(__file__).resolve().parent.parent / "docs" / "flags.md").read_text().splitlines()
    for f in dataclasses.fields(Config):
        if f.metadata.get("cli", True):
            cell = "all" if applies_to(f) == ALGOS else ", ".join(applies_to(f))
            rows = [line for line in table if line.startswith(f"| `--{f.name.replace('_', '-')}`")]
            assert rows and f"| {cell} |" in rows[0], f"{f.name}: run scripts/config_table.py --write"


def test_command_line_refusal_is_one_line_with_exit_code_2() -> None:
    result = launcher.run("train", _argv("--normalize-obs", "sac"), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "asyncrl-train: error: --normalize-obs applies to --algo appo only, not sac; drop it"]


def test_bench_refuses_quick_with_a_single_mode(capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli.bench import main

    assert main(["--mode", "replay", "--quick"]) == 2
    assert capsys.readouterr().err.strip() == ("asyncrl-bench: error: --quick picks the short suite and does nothing "
                                               "with --mode; give --seconds and --repeats instead")


def test_a_sweep_with_a_flag_its_algorithm_does_not_read_is_refused_before_any_run() -> None:
    from asyncrl.sweep import SweepError, parse_sweep

    with pytest.raises(SweepError, match="--epochs applies to --algo appo only, not sac"):
        parse_sweep({"base": {"env": "Pendulum-v1", "epochs": 2}, "grid": {"algo": ["appo", "sac"]}}, "g")
    with pytest.raises(SweepError, match="--tau applies to --algo sac, td3, redq only, not appo"):
        parse_sweep({"base": {"env": "Pendulum-v1"}, "grid": {"tau": [0.01, 0.02]}}, "g")
    assert parse_sweep({"base": {"env": "Pendulum-v1", "algo": "sac"}, "grid": {"tau": [0.01]}}, "g").grid
