"""--env-kwargs reaches the env's constructor, a module beside the user is importable, the preset follows the
observation space."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import asyncrl
from asyncrl.config import ConfigError
from asyncrl.presets import preset_name
from asyncrl.resolve import config_from_flags
from tests import launcher
from tests.train_cli import main_in_process

ROOT = Path(__file__).resolve().parent.parent

MY_ENV = """\
import gymnasium as gym
import numpy as np


class Sized(gym.Env):
    def __init__(self, obs_dim, steps=5):  # no defaults: only --env-kwargs can make it
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.steps, self.t = steps, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(self.observation_space.shape, np.float32), 1.0, self.t >= self.steps, False, {}
"""


def test_kwargs_reach_a_callable_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_env.py").write_text(MY_ENV)
    kwargs = '{"obs_dim": 7, "steps": 4}'
    proc = launcher.run("train", ["--env", "my_env:Sized", "--env-kwargs", kwargs, "--frames", "3000",
                                  "--train-dir", "runs", "--workers", "1"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # Sized has no default obs_dim
    run_dir = tmp_path / "runs" / "my_env_Sized"
    assert json.loads((run_dir / "config.json").read_text())["env_kwargs"] == kwargs
    monkeypatch.chdir(tmp_path)  # load_policy makes the env again, with the recorded arguments
    policy = asyncrl.load_policy(str(run_dir))
    assert policy.obs_shape == (7,) and policy(np.zeros(7, np.float32)) in (0, 1)


@pytest.mark.parametrize(("value", "message"), [("{bad", "is not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_bad_env_kwargs_is_one_line_exit_2(value: str, message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    proc = main_in_process(["--env", "CartPole-v1", "--env-kwargs", value, "--print-config"], tmp_path, capsys)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_registered_ids_get_kwargs_and_a_config_file_may_give_a_mapping() -> None:
    cfg = config_from_flags(env="CartPole-v1", env_kwargs={"sutton_barto_reward": True})
    assert json.loads(cfg.env_kwargs) == {"sutton_barto_reward": True}
    from asyncrl.envs.registry import make_vec_env

    env = make_vec_env("Pendulum-v1", 1, env_kwargs={"g": 3.5})
    assert env.envs[0].unwrapped.g == 3.5
    env.close()
    with pytest.raises(ConfigError, match="must be a JSON object"):
        config_from_flags(env="CartPole-v1", env_kwargs="3")


def test_preset_follows_the_observation_space() -> None:
    sys.path.insert(0, str(ROOT))
    assert preset_name("tests.custom_env:ChannelsLastImages") == "atari"  # uint8 (H, W, C) frames
    assert preset_name("tests.custom_env:ChannelsLastImages", {"channels": 1}) == "atari"
    assert preset_name("tests.custom_env:TwoChoiceBandit") == "vector"
    assert preset_name("CartPole-v1") == "vector_batched"  # stepped as one VectorEnv (its vector_entry_point)
    assert preset_name("CartPole-v1", env_vectorization="loop") == "vector"
    assert preset_name("Pendulum-v1") == "vector_continuous"  # Box actions: returns normalised
    cfg = config_from_flags(env="tests.custom_env:ChannelsLastImages")
    assert cfg.batch_size == 1024 and cfg.rollout == 32  # the Atari (Config) defaults, not the vector preset's


def test_frames_are_normalised_by_default_except_for_a_users_encoder() -> None:
    """The Atari preset standardises frames per pixel (--normalize-obs); a user's --encoder module reads the env's
    own frames unless the flag is given; vector presets and the replay learners leave observations alone."""
    sys.path.insert(0, str(ROOT / "tests"))
    assert config_from_flags(env="atari_pong").normalize_obs
    assert config_from_flags(env="tests.custom_env:ChannelsLastImages").normalize_obs  # any uint8 frames
    assert not config_from_flags(env="atari_pong", normalize_obs=False).normalize_obs
    user = "recurrent_models:small_encoder"
    assert not config_from_flags(env="atari_pong", encoder=user).normalize_obs
    assert config_from_flags(env="atari_pong", encoder=user, normalize_obs=True).normalize_obs
    assert config_from_flags(env="atari_pong", encoder="impala").normalize_obs
    assert not config_from_flags(env="CartPole-v1").normalize_obs


def test_the_scale_memory_estimate_makes_the_env_with_its_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncrl.resolve as resolve
    from asyncrl.config import Config
    from asyncrl.envs.registry import make_env_spec
    from asyncrl.runtime.plumbing.trajectories import trajectory_bytes

    sys.path.insert(0, str(ROOT))
    env = "tests.custom_env:ChannelsLastImages"
    cfg = Config(env=env, workers=2, envs_per_worker=4, rollout=16, worker_splits=2, batch_size=128)
    small = trajectory_bytes(cfg, make_env_spec(env))
    large = trajectory_bytes(cfg, make_env_spec(env, env_kwargs={"size": 120}))
    assert large > 2 * small
    monkeypatch.setattr(resolve, "available_memory", lambda: (small + large) / 2 / 0.8)  # room for the small only
    assert resolve._trajectories_fit({"env": env})[1](2, 4, 16, 2)
    assert not resolve._trajectories_fit({"env": env, "env_kwargs": json.dumps({"size": 120})})[1](2, 4, 16, 2)
