"""`asyncrl-enjoy --video` shows what a person sees: the env's rendering, observations only as a fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from asyncrl.cli import enjoy
from asyncrl.config import Config
from asyncrl.envs.registry import make_env_spec
from asyncrl.models.actor_critic import build_model
from asyncrl.runtime.store.checkpoint import save_checkpoint


def checkpoint_for(run_dir: Path, env: str) -> None:
    """A fresh model's checkpoint for `env`, as the learner would save it."""
    cfg = Config(env=env)
    model = build_model(make_env_spec(env), cfg.hidden_size, cfg.normalize_obs)
    save_checkpoint(str(run_dir), 3, {"learner": {"model": model.state_dict(), "version": 3}, "env_steps": 0,
                                      "config": cfg.to_json(), "env": env}, keep=1)


def gif_frames(path: Path) -> list[np.ndarray]:
    img = Image.open(path)
    frames = []
    for i in range(img.n_frames):
        img.seek(i)
        frames.append(np.asarray(img.convert("RGB")))
    return frames


def test_cartpole_video_is_its_rendering(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint_for(tmp_path, "CartPole-v1")
    video = tmp_path / "cartpole.gif"
    assert enjoy.main([str(tmp_path), "--episodes", "1", "--max-steps", "20", "--video", str(video)]) == 0
    out = capsys.readouterr().out
    assert "cannot render" not in out
    frames = gif_frames(video)
    assert len(frames) > 5 and frames[0].shape == (400, 600, 3)  # CartPole's rgb_array screen
    assert not (frames[0] == frames[-1]).all()  # the cart moves


def test_cartpole_video_is_quiet_on_a_headless_machine(tmp_path: Path) -> None:
    """No sound card and no display (this machine, CI): pygame's renderer prints no `ALSA lib ...` lines, as SDL
    is pointed at its dummy drivers (`asyncrl.diagnostics.screens.quiet_headless`); stderr stays empty."""
    import os

    checkpoint_for(tmp_path, "CartPole-v1")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_AUDIODRIVER",
                                                            "SDL_VIDEODRIVER")}
    script = Path(sys.executable).with_name("asyncrl-enjoy")
    result = subprocess.run([str(script), str(tmp_path), "--episodes", "1", "--max-steps", "20", "--video",
                             str(tmp_path / "cartpole.gif")], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_env_without_render_falls_back_to_observations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint_for(tmp_path, "tests.custom_env:make_echo_env")
    video = tmp_path / "echo.gif"
    assert enjoy.main([str(tmp_path), "--episodes", "1", "--video", str(video)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "cannot render" in line]
    assert len(notes) == 1 and "shows its observations instead" in notes[0], notes
    assert Image.open(video).size == (2 * 32, 128)  # one bar per observation dimension


def test_atari_mp4_is_the_full_colour_screen(tmp_path: Path) -> None:
    """With the installed console script (imageio-ffmpeg comes with the install)."""
    import imageio.v2 as imageio

    checkpoint_for(tmp_path, "atari_pong")
    video = tmp_path / "pong.mp4"
    script = Path(sys.executable).with_name("asyncrl-enjoy")
    result = subprocess.run([str(script), str(tmp_path), "--episodes", "1", "--max-steps", "60", "--video",
                             str(video)], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "cannot render" not in result.stdout
    frames = imageio.mimread(str(video))
    assert len(frames) == 60
    assert frames[0].shape == (210, 160, 3)
    colour = np.abs(frames[30].astype(int) - frames[30].mean(axis=-1, keepdims=True)).mean()
    assert colour > 5, "the frames are grey: observations, not the screen"


def test_atari_screens_stay_in_step_with_the_played_env() -> None:
    """The colour companion env sees what the agent's preprocessed env sees, frame for frame."""
    from asyncrl.diagnostics.screens import screens_for
    from asyncrl.envs.registry import make_vec_env

    env = make_vec_env("atari_pong", 1, training=False)
    screens = screens_for(env, "atari_pong")
    obs = np.zeros((1, *env.spec.obs_shape), np.uint8)
    reward, terminated, truncated = np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool)
    final_obs = np.zeros_like(obs)
    env.reset(seed=7, obs_out=obs)
    screens.reset(7)
    rng = np.random.default_rng(0)
    try:
        for _ in range(300):
            actions = rng.integers(0, env.spec.num_actions, size=1)
            env.step(actions, obs, reward, terminated, truncated, final_obs)
            screens.step(actions)
            grey = screens.frame(obs[0]).astype(np.float64) @ [0.299, 0.587, 0.114]  # 210x160
            small = _area_resize(grey, 84, 84)
            assert np.abs(small - obs[0, -1]).mean() < 6
    finally:
        env.close()
        screens.close()


def _area_resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Mean over the source pixels each target pixel covers (nearest-block approximation of INTER_AREA): the
    blocks' sums in two np.add.reduceat passes over their edges, over the blocks' sizes (the same means as a
    slice's .mean() per block, about 100x faster)."""
    rows = (np.arange(h + 1) * img.shape[0] / h).astype(int)
    cols = (np.arange(w + 1) * img.shape[1] / w).astype(int)
    sums = np.add.reduceat(np.add.reduceat(img, rows[:-1], axis=0), cols[:-1], axis=1)
    return sums / np.outer(np.diff(rows), np.diff(cols))
