"""Episode videos for `asyncrl-enjoy`: one image per agent step, saved as GIF (Pillow) or MP4 (imageio-ffmpeg).

The images come from `asyncrl.diagnostics.screens` (what the env renders); `frame_from_obs` draws an
observation for envs that cannot render.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

SCALE = 3  # Atari's 84x84 frames are upscaled to 252x252
BAR_W, BAR_H = 32, 128  # vector observations are drawn as one bar per dimension


class VideoError(ValueError):
    """The video cannot be written as asked (one-line message for the CLI)."""


def frame_from_obs(obs: np.ndarray) -> np.ndarray:
    """An 8-bit image of one env's observation: the newest frame of a stack (C, H, W), a grayscale image
    (H, W), or bars of tanh(value) for a vector."""
    obs = np.asarray(obs)
    if obs.ndim == 3:
        img = obs[-1] if obs.shape[0] <= 4 else obs[..., -1]
    elif obs.ndim == 2:
        img = obs
    else:
        return _bars(obs.reshape(-1).astype(np.float64))
    if img.dtype != np.uint8:
        lo, hi = float(np.min(img)), float(np.max(img))
        img = ((img - lo) / (hi - lo or 1.0) * 255).astype(np.uint8)
    return np.kron(img, np.ones((SCALE, SCALE), dtype=np.uint8))


def _bars(values: np.ndarray) -> np.ndarray:
    img = np.full((BAR_H, BAR_W * len(values)), 255, dtype=np.uint8)
    mid = BAR_H // 2
    img[mid, :] = 0
    for i, v in enumerate(np.tanh(np.nan_to_num(values))):
        top, bottom = sorted((mid, int(mid - v * (mid - 4))))
        img[top:bottom + 1, i * BAR_W + 4:(i + 1) * BAR_W - 4] = 80
    return img


def save_video(frames: Sequence[np.ndarray], path: str, fps: int = 30) -> str:
    """Write `frames` (uint8 images) to `path`: .gif with Pillow, .mp4 with imageio + imageio-ffmpeg."""
    if not frames:
        raise VideoError("no frames to write")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        images[0].save(path, save_all=True, append_images=images[1:], duration=max(1, 1000 // fps), loop=0)
    elif ext == ".mp4":
        try:
            import imageio.v2 as imageio
        except ImportError:
            raise VideoError("an .mp4 video needs imageio and imageio-ffmpeg (pip install imageio "
                             "imageio-ffmpeg); or pass a .gif path") from None
        # H.264 in yuv420p needs even sizes; pad (e.g. Atari's 210x160 screen stays 210x160) rather than let
        # the writer rescale to multiples of 16.
        imageio.mimwrite(path, [_even(f) for f in frames], fps=fps, macro_block_size=1)
    else:
        raise VideoError(f"unknown video format {ext or path!r}; use .gif (or .mp4 with imageio-ffmpeg)")
    return path


def _even(frame: np.ndarray) -> np.ndarray:
    h, w = frame.shape[:2]
    pad = ((0, h % 2), (0, w % 2)) + ((0, 0),) * (frame.ndim - 2)
    return np.pad(frame, pad, mode="edge") if h % 2 or w % 2 else frame


def check_video_path(path: str) -> None:
    """Fail before playing: a bad extension or a missing mp4 writer."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".gif", ".mp4"):
        raise VideoError(f"unknown video format {ext or path!r}; use .gif (or .mp4 with imageio-ffmpeg)")
    if ext == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise VideoError("an .mp4 video needs imageio and imageio-ffmpeg (pip install imageio "
                             "imageio-ffmpeg); or pass a .gif path") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise VideoError(f"no directory {folder} for the video")
