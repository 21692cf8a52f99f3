"""`asyncrl-enjoy RUN_DIR`: play full episodes with the run's latest good checkpoint and report raw scores."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from asyncrl.cli.errors import OneLineParser
from asyncrl.diagnostics.rundir import RunDirError, require_dir
from asyncrl.diagnostics.screens import Screens, quiet_headless, screens_for
from asyncrl.diagnostics.video import VideoError, check_video_path, save_video
from asyncrl.envs.base import EnvError

MAX_VIDEO_FRAMES = 5000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="asyncrl-enjoy", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("run_dir", help="the run's directory (TRAIN_DIR/EXPERIMENT)")
    parser.add_argument("--episodes", type=int, default=5, help="full episodes to play (default: %(default)s)")
    parser.add_argument("--video", metavar="FILE", help="save the first episode as FILE (.gif or .mp4): the env's "
                                                        "own rendering (Atari: the full-colour screen), or its "
                                                        "observations if it cannot render")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: %(default)s)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action (the Gaussian mean; for "
                                                              "SAC the tanh of the mean, for TD3 the deterministic "
                                                              "actor) instead of sampling as in training")
    parser.add_argument("--best", action="store_true", help="play checkpoints/best.pt (the best evaluation of a run "
                                                            "trained with --eval-every), not the newest checkpoint")
    parser.add_argument("--policy", type=int, default=0, help="which policy of a --num-policies run to play "
                        "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=12345, help="env seed (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=100_000, help="cut an episode after this many agent "
                                                                         "steps (default: %(default)s)")
    return parser.parse_args(argv)


def play(head, env, args: argparse.Namespace, screens: Screens | None = None) -> tuple[list[float], list[np.ndarray]]:
    """Scores of `args.episodes` full episodes, and the first episode's frames (from `screens`) when a video is
    wanted. `head` is the run's `asyncrl.agents.base.ActingHead`: it picks the actions the env receives, through
    the acting contract (`asyncrl.agents.acting.Actor`)."""
    import torch

    from asyncrl.agents.acting import module_device
    from asyncrl.envs.dict_obs import first_image, obs_zeros, zeros_like
    from asyncrl.models.obs import obs_from_numpy

    spec, n = env.spec, env.num_envs  # n > 1: the agents of a multi-agent env, all played by the policy
    obs = obs_zeros(spec, n)
    reward, terminated, truncated = np.zeros(n, np.float32), np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    final_obs = zeros_like(obs)
    actions = np.zeros((n, *spec.action_shape), dtype=spec.action_dtype)
    env.reset(seed=args.seed, obs_out=obs)
    if screens is not None:
        screens.reset(args.seed)
        if screens.note:
            print(f"asyncrl-enjoy: {screens.note}")
    device = module_device(head)
    state, first = head.initial_state(n), torch.ones(n, dtype=torch.bool, device=device)  # the acting contract
    scores, frames, steps, score = [], [], 0, 0.0
    while len(scores) < args.episodes:
        recording = screens is not None and not scores and len(frames) < MAX_VIDEO_FRAMES
        if recording:
            frames.append(screens.frame(first_image(obs[0])))
        with torch.no_grad():
            act, _, state = head.act(obs_from_numpy(obs, device), state, first, greedy=args.greedy)
        actions[:] = act.cpu().numpy()
        finished = env.step(actions, obs, reward, terminated, truncated, final_obs)
        starts = terminated | truncated if env.skipped is None else terminated | truncated | env.skipped
        first[:] = torch.from_numpy(starts)
        if recording:
            screens.step(actions)
        steps += 1
        score += float(reward[0])
        if n > 1:  # every agent's episode is a score of its own
            for episode in finished[:args.episodes - len(scores)]:
                scores.append(episode.ret)
                print(f"episode {len(scores)}: agent {episode.env} score {episode.ret:g} ({episode.length} steps)")
            if steps >= args.max_steps and len(scores) < args.episodes:
                print(f"cut after {steps} steps")
                break
            continue
        if finished or steps >= args.max_steps:
            scores.append(finished[0].ret if finished else score)
            print(f"episode {len(scores)}: score {scores[-1]:g} ({steps} steps{'' if finished else ', cut'})")
            steps, score = 0, 0.0
    return scores, frames


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.video:
        quiet_headless()  # before any env or renderer loads SDL
    try:
        if args.episodes < 1:
            raise RunDirError("--episodes must be at least 1")
        require_dir(args.run_dir)
        if args.video:
            check_video_path(args.video)
        head, env = load(args)
    except (RunDirError, VideoError, EnvError) as exc:
        print(f"asyncrl-enjoy: error: {exc}", file=sys.stderr)
        return 2
    screens = None
    try:
        if args.video:
            screens = screens_for(env, env.spec.name)
        scores, frames = play(head, env, args, screens)
    finally:
        env.close()
        if screens is not None:
            screens.close()
    if not scores:
        print(f"asyncrl-enjoy: error: no episode ended within --max-steps {args.max_steps}", file=sys.stderr)
        return 1
    spread = statistics.pstdev(scores) if len(scores) > 1 else 0.0
    print(f"{len(scores)} episode{'s' if len(scores) > 1 else ''}: raw score mean {statistics.fmean(scores):g}, "
          f"std {spread:g}")
    if args.video:
        fps = 60 // env.spec.frameskip if env.spec.frameskip > 1 else 30  # Atari runs at 60 emulator frames/s
        print(f"video: {save_video(frames, args.video, fps)}")
    return 0


def load(args: argparse.Namespace):
    """The run's acting head (eval mode; the run's `algo` says how to build it) from the latest good checkpoint,
    or from checkpoints/best.pt with `--best`, and a one-env eval-mode vector env."""
    import torch

    from asyncrl.config import Config
    from asyncrl.envs.registry import make_vec_env
    from asyncrl.policy import PolicyLoadError, read_checkpoint, restore_policy
    from asyncrl.runtime.store.checkpoint import CheckpointError

    torch.set_num_threads(1)  # batch-1 inference: more threads only spin, badly so on a busy machine
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise RunDirError("--device cuda: no CUDA device is available; use --device cpu")
    try:
        path, state = read_checkpoint(args.run_dir, args.best,
                                      warn=lambda msg: print(f"asyncrl-enjoy: {msg}", file=sys.stderr))
    except CheckpointError as exc:
        raise RunDirError(str(exc)) from None
    cfg = Config.from_dict(json.loads(state["config"]))
    env = make_vec_env(cfg, 1, training=False, render_mode="rgb_array" if args.video else None,
                       env=state.get("env", cfg.env))
    try:
        run = restore_policy(state, path, env.spec, device, args.policy)
    except PolicyLoadError as exc:
        env.close()
        raise RunDirError(str(exc)) from None
    print(f"asyncrl-enjoy: {path} (policy version {state['learner'].get('version', '?')}) on {env.spec.name}")
    return run.head, env


if __name__ == "__main__":
    from asyncrl.cli.console import exit_now

    exit_now(main())
