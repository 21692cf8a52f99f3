"""What a person sees of the env `asyncrl-enjoy` plays: `env.render()` frames, not the agent's observations.

- Atari (`atari_<game>`): ale_py's C++ vector env has no `render`, so a second one with the same settings and
  seed, but full-colour 210x160 frames, is stepped with the same actions. With sticky actions off, the
  emulator is deterministic given the seed, so both stay on the same frame (tests/test_video.py checks it).
- gymnasium envs made with `render_mode="rgb_array"` (registered ids) or that render an RGB array anyway.
- Anything else falls back to images of the observations, and `note` says so in one line.
"""

from __future__ import annotations

import os

import numpy as np

from asyncrl.diagnostics.video import frame_from_obs
from asyncrl.envs.base import VecEnv

SOUND_CARDS = "/proc/asound/cards"


def quiet_headless(environ: dict[str, str] | None = None, cards: str = SOUND_CARDS) -> list[str]:
    """On a machine without a sound card or a display, point SDL (pygame's renderers) at its dummy drivers, so
    rendering prints no `ALSA lib ... cannot find card` lines; a driver the user set is kept. The names set."""
    env = os.environ if environ is None else environ
    try:
        with open(cards) as f:
            sound = "no soundcards" not in f.read()
    except OSError:
        sound = False
    wanted = {"SDL_AUDIODRIVER": not sound,
              "SDL_VIDEODRIVER": not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))}
    set_now = [name for name, dummy in wanted.items() if dummy and name not in env]
    for name in set_now:
        env[name] = "dummy"
    return set_now


class Screens:
    """Frames of env 0: `reset`/`step` mirror the played env's calls, `frame` gives the current image."""

    note: str | None = None  # one line for the user when the video shows observations instead

    def reset(self, seed: int) -> None:  # noqa: B027 - optional hook
        """Called after the played env's reset."""

    def step(self, actions: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Called after the played env's step with the same actions."""

    def frame(self, obs: np.ndarray) -> np.ndarray:
        """An image of env 0's current state (obs: its current observation)."""
        return frame_from_obs(obs)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class _GymScreens(Screens):
    def __init__(self, env, name: str) -> None:
        self.env, self.name = env, name
        self.renders = False

    def reset(self, seed: int) -> None:
        why = _cannot_render(self.env)  # only now: gymnasium envs refuse to render before their first reset
        self.renders = why is None
        self.note = None if self.renders else _fallback_note(self.name, why)

    def frame(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(self.env.render()) if self.renders else frame_from_obs(obs)


class _AtariScreens(Screens):
    def __init__(self, game: str) -> None:
        from ale_py.vector_env import AtariVectorEnv

        from asyncrl.envs import atari

        self._env = AtariVectorEnv(
            game, 1, num_threads=1, repeat_action_probability=0.0, noop_max=30, frameskip=atari.FRAMESKIP,
            maxpool=True, use_fire_reset=True, img_height=210, img_width=160, grayscale=False, stack_num=1,
            episodic_life=False, life_loss_info=False, reward_clipping=False, autoreset_mode="SameStep")
        self._screen: np.ndarray | None = None

    def reset(self, seed: int) -> None:
        obs, _ = self._env.reset(seed=np.array([int(seed) % 2**31]))  # as AtariVecEnv.reset seeds env 0
        self._screen = obs.reshape(210, 160, 3)

    def step(self, actions: np.ndarray) -> None:
        obs, *_ = self._env.step(np.asarray(actions, dtype=np.int64).reshape(1))
        self._screen = obs.reshape(210, 160, 3)

    def frame(self, obs: np.ndarray) -> np.ndarray:
        return self._screen.copy()

    def close(self) -> None:
        self._env.close()


def screens_for(env: VecEnv, name: str) -> Screens:
    """The best way to show env 0 of `env` (env `name`). Call `reset` after the env's reset and before the
    first `frame`; then `note` says (one line) whether the video falls back to observations."""
    from asyncrl.envs.names import ATARI_PREFIX
    from asyncrl.envs.registry import backend_for

    if backend_for(name).name == "atari":
        return _AtariScreens(name[len(ATARI_PREFIX):])
    envs = getattr(env, "envs", None)
    if envs:
        return _GymScreens(envs[0], name)
    fallback = Screens()
    fallback.note = _fallback_note(name, "its backend has no render()")
    return fallback


def _fallback_note(name: str, why: str) -> str:
    return f"{name} cannot render ({why}); the video shows its observations instead"


def _cannot_render(env) -> str | None:
    """None if env.render() gives an RGB image now, else why not."""
    try:
        img = env.render()
    except Exception as exc:  # NotImplementedError for envs without render, anything else from a broken one
        detail = (str(exc).strip().splitlines() or [""])[0][:160]
        return f"render() raised {type(exc).__name__}{': ' + detail if detail else ''}"
    if img is None:
        return f"render() returned nothing (render_mode {getattr(env, 'render_mode', None)!r})"
    img = np.asarray(img)
    if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
        return f"render() gave an array of shape {img.shape} and dtype {img.dtype}, not an RGB image"
    return None
