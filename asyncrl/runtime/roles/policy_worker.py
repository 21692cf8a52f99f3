"""Policy worker: the inference stage (`asyncrl.runtime.stages.inference`) in its own process, over shared memory.

It batches observation requests from many rollout workers into one forward pass of the stage, tells each
rollout worker which of its splits is ready, and between batches picks up the learner's newest weights when
their version has changed. This file is the transport: the request queue, the `want`/`acted` handshake
(runtime/plumbing/liveness.py), the wake-ups and the reports.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.agents.acting import Actor, published_actor
from asyncrl.agents.registry import learner_class
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.host.devices import resolve_device
from asyncrl.runtime.host.seeding import make_deterministic
from asyncrl.runtime.plumbing.channels import Channels, Empty, report
from asyncrl.runtime.plumbing.interval_stats import IntervalStats
from asyncrl.runtime.plumbing.liveness import busy_beating
from asyncrl.runtime.plumbing.weights import WeightsReader
from asyncrl.runtime.roles.process import init_child
from asyncrl.runtime.stages.inference import InferenceStage
from asyncrl.shm import SharedArrays, SharedWeights


def run_policy_worker(index: int, cfg: Config, spec: EnvSpec, traj: SharedArrays,
                      weights: list[SharedWeights] | SharedWeights, channels: Channels) -> None:
    weights = weights if isinstance(weights, list) else [weights]
    init_child(f"asyncrl-policy-{index}", cfg.policy_nice)
    torch.set_num_threads(1)
    if cfg.deterministic:
        make_deterministic()
    device = resolve_device(cfg.device)
    # One model per policy (--num-policies), each kept in sync with its own published weights.
    models = [learner_class(cfg.algo).build_policy(spec, cfg, device).eval() for _ in weights]
    readers = [WeightsReader(m, w) for m, w in zip(models, weights)]
    actors = compiled_actors(index, cfg, spec, models, channels)
    if actors is None:
        return  # reported as fatal; the runner stops the run
    stage = InferenceStage(cfg, spec, traj, actors, device)
    while any(r.version == 0 for r in readers) and not channels.stopping:  # wait for the learner's first weights
        sum(r.refresh() for r in readers) or time.sleep(0.01)
    # Distinct sampling noise per worker, per restart and per resumed run (forked workers share torch's default).
    torch.manual_seed(hash((cfg.seed, index, int(channels.live["policy_epoch"][0]), readers[0].version)) % 2**63)
    serve_requests(index, cfg, stage, readers, channels)


def compiled_actors(index: int, cfg: Config, spec: EnvSpec, models: list[torch.nn.Module],
                    channels: Channels) -> list[Actor] | None:
    """The acting contract of each model: eager, or with --compile inference|all compiled on padded requests and
    warmed up here, with a progress line before and after. None after a fatal report (torch cannot compile it)."""
    if cfg.compile not in ("inference", "all") or cfg.algo != "appo":
        return [published_actor(m) for m in models]
    from asyncrl.agents.compiled import CompileError, autocast_dtype, cache_dir
    from asyncrl.agents.compiled_acting import CompiledActor

    max_splits = max(1, cfg.num_splits // cfg.policy_workers)
    actors = [CompiledActor(m, spec, cfg.envs_per_split, max_splits, cfg.compile_mode,
                            autocast_dtype(cfg.precision, resolve_device(cfg.device))) for m in models]
    if index == 0:
        report(channels, "info", index, {"message": f"compiling the policy's act for {actors[0].sizes} rows "
                                                    f"(cache {cache_dir()})..."})
    try:
        with busy_beating(channels.live, "beat_policy", index):
            seconds = sum(a.warm_up() for a in actors)
    except CompileError as exc:
        channels.reports.put(("fatal", index, time.time(), {"message": str(exc), "hint": False, "exit_code": 2}),
                             timeout=10)
        while not channels.stopping:
            time.sleep(0.05)
        return None
    report(channels, "info", index, {"message": f"policy worker {index}: act compiled in {seconds:.1f} s"})
    return actors


def serve_requests(index: int, cfg: Config, stage: InferenceStage, readers: list[WeightsReader],
                   channels: Channels) -> None:
    """Until the stop: take up to a batch of requests, refresh the weights, act on the current ones, wake their
    rollout workers, report."""
    want, acted = channels.live["want"], channels.live["acted"]  # the action handshake
    max_batch = max(1, cfg.num_splits // cfg.policy_workers)
    stats = IntervalStats(channels, "policy", index, cfg.report_interval)
    for key in ("batches", "samples", "t_infer", "t_wait"):
        stats.add(key, 0)
    serving = False  # until the first request, the wait is the rollout workers' start-up, not a stage
    while not channels.stopping:
        t0 = time.monotonic()
        try:
            requests = channels.requests.get_many(timeout=0.1, max_messages_to_get=max_batch)
        except Empty:
            stats.add("t_wait", time.monotonic() - t0)
            stats.maybe_report(version=readers[0].version)  # idle workers report too
            continue
        t1 = time.monotonic()
        if not serving:
            stats.restart()
            t0, serving = t1, True
        for r in readers:
            r.refresh()
        req = np.asarray(requests, dtype=np.int64)
        req = req[want[req[:, 2]] == req[:, 3]]  # not stale (a dead rollout worker's) nor repeated (re-sent)
        if not len(req):
            continue
        workers, splits, slots, steps = req[:, 0], req[:, 1], req[:, 2], req[:, 3]
        samples = stage.serve(slots, steps, [r.version for r in readers])
        acted[slots] = steps
        for w, s in zip(workers.tolist(), splits.tolist()):
            channels.actions_ready[w].put(s)
        stats.add("t_wait", t1 - t0)
        stats.add("t_infer", time.monotonic() - t1)
        stats.add("batches", 1)
        stats.add("samples", samples)
        stats.maybe_report(version=readers[0].version)
