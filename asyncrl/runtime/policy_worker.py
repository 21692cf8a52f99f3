"""Policy worker: batches observation requests from many rollout workers into one forward pass.

It gathers the requested observations from the shared trajectory buffer, samples actions, writes actions,
log-probs and its policy version back into the same slots, and tells each rollout worker which of its splits
is ready. Between batches it picks up the learner's newest weights when their version has changed.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.learners.registry import learner_class
from asyncrl.models.actor_critic import flat_state
from asyncrl.runtime.channels import Channels, Empty
from asyncrl.runtime.devices import resolve_device
from asyncrl.runtime.interval_stats import IntervalStats
from asyncrl.runtime.process import init_child
from asyncrl.runtime.seeding import make_deterministic
from asyncrl.runtime.shared import SharedArrays, SharedWeights
from asyncrl.runtime.trajectories import obs_arrays


class WeightsReader:
    """Keeps a local model in sync with the learner's published weights."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights):
        self.model, self.weights = model, weights
        self.tensors = flat_state(model)
        self.scratch = np.empty(sum(t.numel() for t in self.tensors), dtype=np.float32)
        self.version = 0

    def refresh(self) -> bool:
        """Load newer weights if there are any; True if the model changed."""
        if self.weights.version == self.version:
            return False
        version = self.weights.read_into(self.scratch)
        if version is None:
            return False
        src = torch.from_numpy(self.scratch)
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                t.copy_(src[offset:offset + t.numel()].view_as(t), non_blocking=True)
                offset += t.numel()
        self.version = version
        return True


def run_policy_worker(index: int, cfg: Config, spec: EnvSpec, traj: SharedArrays, weights: SharedWeights,
                      channels: Channels) -> None:
    init_child(f"asyncrl-policy-{index}", cfg.policy_nice)
    torch.set_num_threads(1)
    if cfg.deterministic:
        make_deterministic()
    device = resolve_device(cfg.device)
    model = learner_class(cfg.algo).build_policy(spec, cfg, device).eval()  # what the learner publishes
    reader = WeightsReader(model, weights)
    while reader.version == 0 and not channels.stopping:  # wait for the learner's first weights
        reader.refresh() or time.sleep(0.01)
    # Distinct sampling noise per worker, per restart and per resumed run (forked workers share torch's default).
    torch.manual_seed(hash((cfg.seed, index, int(channels.live["policy_epoch"][0]), reader.version)) % 2**63)

    obs, actions, logp, versions = obs_arrays(traj, "obs"), traj["actions"], traj["logp"], traj["versions"]
    want, acted = channels.live["want"], channels.live["acted"]  # the action handshake (runtime/liveness.py)
    max_batch = max(1, cfg.num_splits // cfg.policy_workers)
    stats = IntervalStats(channels, "policy", index)
    for key in ("batches", "samples", "t_infer", "t_wait"):
        stats.add(key, 0)
    serving = False  # until the first request, the wait is the rollout workers' start-up, not a stage
    while not channels.stopping:
        t0 = time.monotonic()
        try:
            requests = channels.requests.get_many(timeout=0.1, max_messages_to_get=max_batch)
        except Empty:
            stats.add("t_wait", time.monotonic() - t0)
            stats.maybe_report(version=reader.version)  # idle workers report too
            continue
        t1 = time.monotonic()
        if not serving:
            stats.restart()
            t0, serving = t1, True
        reader.refresh()
        req = np.asarray(requests, dtype=np.int64)
        current = want[req[:, 2]] == req[:, 3]
        if not current.all():  # stale (from a dead rollout worker) or repeated (re-sent) requests
            req = requests = req[current]
            if not len(req):
                continue
        workers, splits, slots, steps = req[:, 0], req[:, 1], req[:, 2], req[:, 3]
        if spec.is_dict:  # one gathered copy per key
            flat = {k: torch.from_numpy(a[slots, steps]).flatten(0, 1).to(device, non_blocking=True)
                    for k, a in obs.items()}
            n_samples = len(requests) * cfg.envs_per_split
        else:
            batch = torch.from_numpy(obs[slots, steps])  # [n, envs_per_split, ...] gathered copy
            flat = batch.reshape(-1, *spec.obs_shape).to(device, non_blocking=True)
            n_samples = flat.shape[0]
        acts, lps = model.act(flat)
        actions[slots, steps] = acts.cpu().numpy().reshape(len(requests), cfg.envs_per_split, *spec.action_shape)
        logp[slots, steps] = lps.cpu().numpy().reshape(len(requests), cfg.envs_per_split)
        versions[slots, steps] = reader.version
        acted[slots] = steps
        for w, s in zip(workers.tolist(), splits.tolist()):
            channels.actions_ready[w].put(s)
        stats.add("t_wait", t1 - t0)
        stats.add("t_infer", time.monotonic() - t1)
        stats.add("batches", 1)
        stats.add("samples", n_samples)
        stats.maybe_report(version=reader.version)
