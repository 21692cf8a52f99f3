"""Policy worker: batches observation requests from many rollout workers into one forward pass.

It gathers the requested observations from the shared trajectory buffer, samples actions through the acting
contract (`asyncrl.agents.acting`), writes actions, log-probs and its policy version back into the same slots,
and tells each rollout worker which of its splits is ready. An actor with state also gathers each env's state
and episode-start flag at the step and writes the state after it into the next step's row (a feed-forward
actor has neither, and nothing is gathered). Between batches it picks up the learner's newest weights when their
version has changed.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.agents.acting import Actor, State, published_actor
from asyncrl.agents.registry import learner_class
from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.models.obs import Obs, map_obs
from asyncrl.runtime.host.devices import resolve_device
from asyncrl.runtime.host.seeding import make_deterministic
from asyncrl.runtime.plumbing.channels import Channels, Empty
from asyncrl.runtime.plumbing.interval_stats import IntervalStats
from asyncrl.runtime.plumbing.trajectories import obs_arrays, state_arrays
from asyncrl.runtime.plumbing.weights import WeightsReader
from asyncrl.runtime.roles.process import init_child
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
    actors = [published_actor(m) for m in models]
    readers = [WeightsReader(m, w) for m, w in zip(models, weights)]
    actor, reader = actors[0], readers[0]
    while any(r.version == 0 for r in readers) and not channels.stopping:  # wait for the learner's first weights
        sum(r.refresh() for r in readers) or time.sleep(0.01)
    # Distinct sampling noise per worker, per restart and per resumed run (forked workers share torch's default).
    torch.manual_seed(hash((cfg.seed, index, int(channels.live["policy_epoch"][0]), reader.version)) % 2**63)
    policy_of = traj["policy"] if len(actors) > 1 else None

    obs, actions, logp, versions = obs_arrays(traj, "obs"), traj["actions"], traj["logp"], traj["versions"]
    first, state = traj["first"], state_arrays(traj)
    layout = actor.state_layout()  # the slots were sized from the settings alone (asyncrl.models.registry)
    if set(layout) != set(state) or any(state[k].shape[3:] != tuple(shape) or state[k].dtype != np.dtype(dtype)
                                        for k, (shape, dtype) in layout.items()):
        raise RuntimeError(f"the trajectory slots hold the state {({k: a.shape[3:] for k, a in state.items()})}, "
                           f"the actor's is {({k: shape for k, (shape, _) in layout.items()})}")
    want, acted = channels.live["want"], channels.live["acted"]  # the action handshake (runtime/plumbing/liveness.py)
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
            stats.maybe_report(version=reader.version)  # idle workers report too
            continue
        t1 = time.monotonic()
        if not serving:
            stats.restart()
            t0, serving = t1, True
        for r in readers:
            r.refresh()
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
        starts, before = None, {}
        if state:  # a recurrent actor: each env's state and episode start at this step, its state after it
            starts = torch.from_numpy(first[slots, steps]).flatten().to(device, non_blocking=True)
            before = {k: torch.from_numpy(a[slots, steps]).flatten(0, 1).to(device, non_blocking=True)
                      for k, a in state.items()}
        if policy_of is None:
            acts, lps, after = actor.act(flat, before, starts)
            versions[slots, steps] = reader.version
        else:
            rows = policy_of[slots, steps].reshape(-1)
            acts, lps, after = act_by_policy(actors, rows, flat, before, starts)
            versions[slots, steps] = np.array([r.version for r in readers])[rows].reshape(len(requests), -1)
        for k, a in state.items():
            a[slots, steps + 1] = after[k].cpu().numpy().reshape(len(requests), cfg.envs_per_split, *a.shape[3:])
        actions[slots, steps] = acts.cpu().numpy().reshape(len(requests), cfg.envs_per_split, *spec.action_shape)
        logp[slots, steps] = lps.cpu().numpy().reshape(len(requests), cfg.envs_per_split)
        acted[slots] = steps
        for w, s in zip(workers.tolist(), splits.tolist()):
            channels.actions_ready[w].put(s)
        stats.add("t_wait", t1 - t0)
        stats.add("t_infer", time.monotonic() - t1)
        stats.add("batches", 1)
        stats.add("samples", n_samples)
        stats.maybe_report(version=reader.version)


def act_by_policy(actors: list[Actor], rows: np.ndarray, obs: Obs, state: State, first: torch.Tensor | None,
                  ) -> tuple[torch.Tensor, torch.Tensor, State]:
    """Each row acted on by the policy `rows` names (one forward pass per policy present), in the rows' order."""
    out_actions: torch.Tensor | None = None
    out_logp: torch.Tensor | None = None
    out_state: State = {}
    for p in np.unique(rows).tolist():
        idx = torch.from_numpy(np.flatnonzero(rows == p))
        acts, lps, after = actors[p].act(map_obs(obs, lambda x, idx=idx: x[idx.to(x.device)]),
                                         {k: v[idx.to(v.device)] for k, v in state.items()},
                                         None if first is None else first[idx.to(first.device)])
        if out_actions is None:
            out_actions = acts.new_empty((len(rows), *acts.shape[1:]))
            out_logp = lps.new_empty(len(rows))
            out_state = {k: v.new_empty((len(rows), *v.shape[1:])) for k, v in after.items()}
        out_actions[idx.to(acts.device)] = acts
        out_logp[idx.to(lps.device)] = lps
        for k, v in after.items():
            out_state[k][idx.to(v.device)] = v
    assert out_actions is not None and out_logp is not None
    return out_actions, out_logp, out_state
