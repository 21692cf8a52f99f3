"""The evaluation stage: whole episodes played with a policy model through the acting contract
(`asyncrl.agents.acting`), greedy and sampled, on envs of its own; the best weights by greedy return kept as
`checkpoints/best.pt`, and with `--eval-video` one greedy episode written as a video. Played by the evaluator
process (`runtime/roles/evaluator.py`) and inline by an in-process transport (`stages/local_learner.py`)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec, VecEnv
from asyncrl.envs.dict_obs import first_image, obs_zeros, zeros_like

MAX_EPISODE_STEPS = 100_000  # an episode still running after this many agent steps is scored as it stands
SEED_OFFSET = 1_000_000  # eval envs get seeds of their own, away from the training envs'
MAX_VIDEO_FRAMES = 5000
GIF_MAX_FRAMES = 200
GIF_MAX_SIDE = 160
MACRO_BLOCK = 16


def evaluate(cfg: Config, spec: EnvSpec, model, version: int, due: int, best: float | None,
             alive: Callable[[], bool], warn: Callable[[str], None]) -> tuple[dict[str, Any] | None, float | None]:
    """One evaluation of `model` (policy `version`, at `due` frames): the `eval_*` result (None when `alive()`
    turned False part-way) and the best greedy return so far, `best` or this one (then saved as best.pt).
    Played by the evaluator process, and inline by the serial loop (`asyncrl.runtime.serial`)."""
    from asyncrl.runtime.plumbing.eval_schedule import staging_dir
    from asyncrl.runtime.store.best_checkpoint import BEST_NAME, best_path, save_best

    t0 = time.monotonic()
    greedy, frames = _play(model, cfg, spec, cfg.eval_episodes, True, alive, record=cfg.eval_video)
    sampled, _ = _play(model, cfg, spec, cfg.eval_episodes, False, alive)
    if not alive():
        return None, best
    result: dict[str, Any] = {
        "eval_frames": due, "eval_policy_version": version,
        "eval_return_mean": statistics.fmean(r for r, _ in greedy), "eval_return_std": _std(greedy),
        "eval_sampled_return_mean": statistics.fmean(r for r, _ in sampled),
        "eval_sampled_return_std": _std(sampled),
        "eval_len_mean": statistics.fmean(n for _, n in greedy + sampled),
    }
    # Files go to a staging folder; receiving the report moves them into place (`EvalSchedule.receive`).
    staging, staged = staging_dir(cfg.run_dir, due), []
    if best is None or result["eval_return_mean"] > best:
        best = result["eval_return_mean"]
        try:
            staged.append((save_best(cfg, model, version, due, result["eval_return_mean"], result["eval_return_std"],
                                     path=os.path.join(staging, BEST_NAME)), best_path(cfg.run_dir)))
        except OSError as exc:
            warn(f"eval: cannot write best.pt ({exc.strerror or exc})")
    result["eval_best_return"] = best
    if frames:
        try:
            written = _write_video(staging, due, frames, spec)
        except (OSError, ValueError) as exc:
            warn(f"eval: cannot write the video ({exc})")
        else:
            for key, path in written.items():
                result[key] = os.path.join(cfg.run_dir, "videos", os.path.basename(path))
                staged.append((path, result[key]))
    result["staged"] = staged
    result["eval_seconds"] = time.monotonic() - t0
    return result, best


def _std(episodes: list[tuple[float, int]]) -> float:
    return statistics.pstdev(r for r, _ in episodes) if len(episodes) > 1 else 0.0


def _play(model, cfg: Config, spec: EnvSpec, n: int, greedy: bool, alive: Callable[[], bool],
          record: bool = False) -> tuple[list[tuple[float, int]], list[np.ndarray]]:
    """(return, length) of the first episode of each of `n` fresh envs (of every agent of enough instances of a
    multi-agent env, all played by the published policy), and env 0's frames when `record`."""
    import torch

    from asyncrl.agents.acting import published_actor
    from asyncrl.models.obs import obs_from_numpy

    env, render = _make_env(cfg, n, record)
    n = env.num_envs  # a multi-agent env's whole instances: a column per agent
    actor = published_actor(model)
    state = actor.initial_state(n)
    first = np.ones(n, np.bool_)  # each env's episode starts at this step
    obs = obs_zeros(spec, n)
    reward, done = np.zeros(n, np.float32), np.zeros(n, np.bool_)
    actions = np.zeros((n, *spec.action_shape), dtype=spec.action_dtype)
    returns, lengths = np.zeros(n, np.float64), np.zeros(n, np.int64)
    finished = np.zeros(n, np.bool_)
    frames: list[np.ndarray] = []
    step = _stepper(env, obs)
    try:
        env.reset(seed=cfg.seed + SEED_OFFSET + (0 if greedy else n), obs_out=obs)
        for _ in range(MAX_EPISODE_STEPS):
            if record and not finished[0] and len(frames) < MAX_VIDEO_FRAMES:
                frame = render() if render is not None else None
                frames.append(frame if frame is not None else _obs_frame(first_image(obs[0])))
            if finished.all() or not alive():
                break
            with torch.inference_mode():  # greedy: the most likely action; sampled: as the policy workers sample
                act, _, state = actor.act(obs_from_numpy(obs), state, torch.from_numpy(first), greedy)
            actions[:] = act.numpy()
            step(actions, obs, reward, done)
            first[:] = done
            running = ~finished
            returns[running] += reward[running]
            lengths[running] += 1
            finished |= done
    finally:
        env.close()
    return [(float(r), int(n_)) for r, n_ in zip(returns, lengths)], frames


def _stepper(env: VecEnv, obs: np.ndarray) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], object]:
    """`step(actions, obs, reward, done)`: an evaluation only needs to know that an episode ended (terminated
    or truncated alike)."""
    terminated, truncated = np.zeros(len(obs), np.bool_), np.zeros(len(obs), np.bool_)
    final_obs = zeros_like(obs)

    def step(actions: np.ndarray, obs_out: np.ndarray, reward_out: np.ndarray, done_out: np.ndarray) -> object:
        finished = env.step(actions, obs_out, reward_out, terminated, truncated, final_obs)
        np.logical_or(terminated, truncated, out=done_out)
        return finished

    return step


def _make_env(cfg: Config, n: int, record: bool) -> tuple[VecEnv, Callable[[], np.ndarray | None] | None]:
    """Eval-mode envs (made with the run's --env-kwargs), and a colour frame source for env 0 when a video is
    wanted and the env can render one (gymnasium ids; others are drawn from their observations)."""
    from asyncrl.envs.gym_env import GymVecEnv
    from asyncrl.envs.registry import make_vec_env

    env = make_vec_env(cfg, n, training=False, render_mode="rgb_array" if record else None)
    if record and isinstance(env, GymVecEnv):
        return env, _Renderer(env.envs[0])
    return env, None


class _Renderer:
    """`env.render()` as an RGB frame; None from the first failure on (e.g. pygame missing), and then the
    caller draws the observation instead."""

    def __init__(self, env) -> None:
        self.env, self.failed = env, False

    def __call__(self) -> np.ndarray | None:
        if self.failed:
            return None
        try:
            frame = self.env.render()
        except Exception:  # noqa: BLE001 - any renderer problem only costs the colour frames
            frame = None
        if frame is None or np.asarray(frame).ndim != 3:
            self.failed = True
            return None
        return np.asarray(frame, dtype=np.uint8)


def _obs_frame(obs: np.ndarray) -> np.ndarray:
    from asyncrl.diagnostics.video import frame_from_obs

    return frame_from_obs(obs)


def _write_video(folder: str, frames_done: int, frames: list[np.ndarray], spec: EnvSpec) -> dict[str, str]:
    """`folder`/eval_<frames>.mp4, plus a small GIF of the same episode that TensorBoard can show."""
    from PIL import Image

    from asyncrl.diagnostics.video import save_video

    os.makedirs(folder, exist_ok=True)
    fps = 60 // spec.frameskip if spec.frameskip > 1 else 30
    rgb = [_codec_sized(f) for f in frames]
    video = save_video(rgb, os.path.join(folder, f"eval_{frames_done}.mp4"), fps)
    step = max(1, len(rgb) // GIF_MAX_FRAMES)
    small = []
    for f in rgb[::step]:
        image = Image.fromarray(f)
        image.thumbnail((GIF_MAX_SIDE, GIF_MAX_SIDE))
        small.append(np.asarray(image))
    gif = save_video(small, os.path.join(folder, f"eval_{frames_done}.gif"), max(1, fps // step))
    return {"video": video, "gif": gif}


def _codec_sized(frame: np.ndarray) -> np.ndarray:
    """An RGB uint8 image whose sides are multiples of 16 (H.264's macro blocks), padded with its edge pixels."""
    frame = np.asarray(frame, dtype=np.uint8)
    if frame.ndim == 2:
        frame = np.repeat(frame[..., None], 3, axis=-1)
    frame = frame[..., :3]
    pad_h, pad_w = -frame.shape[0] % MACRO_BLOCK, -frame.shape[1] % MACRO_BLOCK
    return np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge") if pad_h or pad_w else frame
