"""Evaluation process (`asyncrl-eval`, `--eval-every`): scores the latest published weights on envs of its own.

When the runner asks (`runtime/plumbing/eval_schedule.py`), it loads the learner's newest weights through the same
seqlock reader as the policy workers, plays `--eval-episodes` whole episodes with greedy actions (argmax, the
Gaussian mean, or an off-policy actor's greedy action) and as many with actions sampled as the policy workers
sample them, both through the acting contract (`asyncrl.agents.acting`), and reports the returns on the
reports queue. Atari envs are in eval mode (whole games, raw scores). The best weights by greedy return so far
are kept as `checkpoints/best.pt` (`runtime/store/best_checkpoint.py`); with `--eval-video` one greedy episode per
evaluation is written to `videos/eval_<frames>.mp4` (and a small GIF for TensorBoard). Both are staged and moved into
place when the runner receives the report (`runtime/plumbing/eval_schedule.py`).

It runs at the lowest CPU priority (nice 19) with one torch thread, so on contended cores it gets what the
learner, the policy workers and the rollout workers leave. The final evaluation, after the samplers have
stopped, is played by a fresh one at the runner's priority, so other programs on the machine cannot starve it.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.plumbing.channels import Channels, report
from asyncrl.runtime.roles.process import init_child
from asyncrl.runtime.stages.evaluation import evaluate
from asyncrl.shm import SharedArrays, SharedWeights

EVAL_NICE = 19
POLL_S = 0.1


def run_evaluator(cfg: Config, spec: EnvSpec, weights: SharedWeights, channels: Channels,
                  request: SharedArrays, nice: int = EVAL_NICE) -> None:
    init_child("asyncrl-eval", nice)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renderers (classic control): no display needed
    import torch

    from asyncrl.agents.registry import learner_class
    from asyncrl.runtime.plumbing.weights import WeightsReader
    from asyncrl.runtime.store.best_checkpoint import read_best_return

    torch.set_num_threads(1)
    beat = channels.live["beat_eval"]
    model = learner_class(cfg.algo).build_policy(spec, cfg, torch.device("cpu")).eval()  # what is published
    reader = WeightsReader(model, weights)
    best = read_best_return(cfg.run_dir)  # a resumed run keeps its best so far
    done = 0  # frames of the last evaluation served (a restarted evaluator serves the newest request)
    while True:
        beat[0] = time.monotonic()
        stopping = channels.stopping  # read before the request: the runner writes a final request, then stops
        due, final = int(request["due"][0]), bool(request["due"][1])
        if stopping and not (final and due > done):  # the final evaluation outlives the stop flag
            return
        if due <= done or (reader.version == 0 and not reader.refresh()):
            time.sleep(POLL_S)
            continue
        done, served = due, done
        reader.refresh()
        alive = functools.partial(_alive, channels, beat, final)  # every env step beats and checks for a stop
        result, best = evaluate(cfg, spec, model, reader.version, due, best, alive,
                                lambda message: report(channels, "warning", 0, {"message": message}))
        if result is None:  # stopped part-way: no result; a final request (even for these frames) is served next
            done = served
            continue
        report(channels, "eval", 0, result)


def _alive(channels: Channels, beat: np.ndarray, final: bool) -> bool:
    beat[0] = time.monotonic()
    return final or not channels.stopping
