"""A remote actor group: the rollout and inference stages on a Ray node, shipping whole trajectory slots.

The group runs as a Ray actor (`asyncrl.runtime.roles.remote_bridge` makes it one). It steps its env splits and
acts on them in one process, as `--serial` does, with a CPU copy of each acting policy loaded from the weights the
bridge publishes (a flat float32 array per policy, `ray.put` once per new version; each group fetches it from the
object store when it sees a newer version on the bridge's `WeightsBoard`). Each call of `collect` steps until at
least one slot is full and returns the full slots as plain arrays, tagged in their `versions` column with the
policy version that acted, so the learner's lag cap and V-trace treat them as local ones. Its slots are its own
(anonymous memory): only copies leave the node.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

import numpy as np

from asyncrl.config import Config
from asyncrl.envs.base import EnvSpec
from asyncrl.runtime.plumbing.policy_map import PolicyMap
from asyncrl.runtime.plumbing.trajectories import allocate_trajectories
from asyncrl.runtime.stages.rollout import RolloutStage, StageFatal, episode_report

CHECK_EVERY_S = 0.05  # how often a group asks for newer weights (a policy worker checks before every batch)


class WeightsBoard:
    """The newest published weights as an object-store ref, for the groups to fetch when theirs are older (a Ray
    actor of the bridge's; the ref travels inside a list, so Ray hands it over unresolved)."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.ref: list[Any] = []

    def post(self, versions: list[int], ref: list[Any]) -> None:
        self.versions, self.ref = versions, ref

    def latest(self, known: list[int]) -> tuple[list[int], list[Any]] | None:
        return None if known == self.versions or not self.ref else (self.versions, self.ref)


def group_config(cfg: Config) -> Config:
    """A remote group's layout: `--remote-envs-per-worker` envs in splits of the run's envs per split."""
    return dataclasses.replace(cfg, workers=1, envs_per_worker=cfg.remote_envs, worker_splits=cfg.remote_splits)


def node_name() -> str:
    """This Ray node as a record names it: its IP address and the head of its node id."""
    try:
        import ray

        return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:6]}"
    except Exception:  # noqa: BLE001 - not in a Ray worker (a test building the group directly)
        return f"{socket.gethostname()}/{os.getpid()}"


class EnvErrorNotes:
    """The group's env faults, passed on with the next shipment (the bridge prints and counts them)."""

    def __init__(self) -> None:
        self.notes: list[dict[str, Any]] = []

    def env_error(self, message: str, where: str, count: int, split: int, action: str) -> None:
        self.notes.append({"message": message, "where": where, "count": count, "split": split, "action": action})


class ActorGroup:
    """Group `index` of the run: its envs, its slots and its acting policies."""

    def __init__(self, cfg: Config, spec: EnvSpec, index: int, generation: int, board: Any = None):
        import torch

        from asyncrl.agents.acting import published_actor
        from asyncrl.agents.registry import learner_class
        from asyncrl.models.actor_critic import flat_state
        from asyncrl.models.registry import state_layout
        from asyncrl.runtime.stages.inference import InferenceStage

        torch.set_num_threads(1)
        self.cfg = gcfg = group_config(cfg)
        self.splits = gcfg.worker_splits
        self.traj = allocate_trajectories(gcfg, spec, state_layout(gcfg), slots=self.splits)
        device = torch.device("cpu")
        self.models = [learner_class(cfg.algo).build_policy(spec, cfg, device).eval()
                       for _ in range(cfg.acting_policies)]
        self.tensors = [flat_state(m) for m in self.models]
        self.versions = [0] * len(self.models)
        self.inference = InferenceStage(gcfg, spec, self.traj, [published_actor(m) for m in self.models], device)
        self.events = EnvErrorNotes()
        # Seeds of the run's splits after the local ones, a fresh set per restart of the group.
        first_split = cfg.num_splits + index * self.splits
        self.rollout = RolloutStage(gcfg, self.traj, self.splits, first_split, self.events, generation)
        envs = self.rollout.make_envs()
        self.policies = PolicyMap(gcfg, 0, envs[0].spec.num_agents) if cfg.acting_policies > 1 else None
        torch.manual_seed(hash((cfg.seed, "remote", index, generation)) % 2**63)
        for split in range(self.splits):
            self.rollout.begin(split, split)
        self.where = node_name()
        self.board, self.checked = board, 0.0  # the bridge's `WeightsBoard`, asked at most every CHECK_EVERY_S

    def _load(self, weights: list[np.ndarray], versions: list[int]) -> None:
        import torch

        with torch.no_grad():
            for tensors, flat in zip(self.tensors, weights):
                src, offset = torch.from_numpy(flat), 0
                for t in tensors:
                    t.copy_(src[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
        self.versions = list(versions)

    def _refresh(self) -> None:
        """Load the newest published weights from the board, if they are newer than the ones acting."""
        now = time.monotonic()
        if self.board is None or now - self.checked < CHECK_EVERY_S:
            return
        import ray

        self.checked = now
        latest = ray.get(self.board.latest.remote(self.versions))
        if latest is not None:
            versions, (ref,) = latest
            self._load(ray.get(ref), versions)

    def collect(self) -> dict[str, Any]:
        """Step until a slot is full, acting on the newest weights (asked for between steps); the full slots'
        arrays and the counts."""
        stage, traj = self.rollout, self.traj
        steps = errors = 0
        episodes: list[tuple] = []
        played: list[int] = []
        t_env = t_infer = 0.0
        full: list[int] = []
        try:
            while not full:
                self._refresh()
                t0 = time.monotonic()
                if self.policies is not None:  # which policy acts for each env column, as a rollout worker writes
                    for split in range(self.splits):
                        slot, t = stage.slots[split], stage.steps[split]
                        self.policies.write(split, traj["policy"][slot, t], traj["first"][slot, t])
                self.inference.serve(np.array(stage.slots), np.array(stage.steps), self.versions)
                t1 = time.monotonic()
                for split in range(self.splits):
                    stepped = stage.step(split)
                    steps += stepped.agent_steps
                    errors += stepped.env_errors
                    episodes += self._episodes(split, stepped.finished, played)
                    if stepped.full:
                        full.append(split)
                t_infer, t_env = t_infer + t1 - t0, t_env + time.monotonic() - t1
        except StageFatal as exc:
            return {"fatal": str(exc), "exit_code": exc.exit_code}
        slots = []
        for split in full:
            slot = stage.hand_over(split)
            slots.append({name: np.array(a[slot]) for name, a in traj.items()})  # copies: the slot is reused
            stage.take_over(split, slot)
        notes, self.events.notes = self.events.notes, []
        return {"slots": slots, "node": self.where, "env_steps": steps, "env_errors": errors, "episodes": episodes,
                "t_env": t_env, "t_infer": t_infer, "errors": notes,
                **({"episode_policies": played} if self.policies is not None else {})}

    def _episodes(self, split: int, finished: list, played: list[int]) -> list[tuple]:
        """The finished episodes as reported, a self-play snapshot's left out; `played` gets who played each."""
        policies = self.policies
        if policies is None:
            return [episode_report(e) for e in finished]
        who = [policies.of(split, e.env) for e in finished]
        kept = [(e, p) for e, p in zip(finished, who) if not policies.pool or policies.learning(p)]
        played += [p for _, p in kept]
        return [episode_report(e) for e, _ in kept]

    def close(self) -> None:
        self.rollout.close()
