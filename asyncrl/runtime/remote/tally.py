"""The runner's tally of the Ray bridge's reports: what the remote actor groups added to the run, per interval.

Record keys (each interval; none without --remote-workers): `remote_env_steps_per_s`, `remote_slots_per_s`,
`remote_bytes_per_s`, `remote_share` (of the interval's env steps), `remote_lag_mean` / `remote_lag_max` (versions
between the acting policy and the learner's newest when a slot reached the learner's queue), `remote_wait_slot_frac`
(the bridge waiting for a free slot: the learner is behind), `remote_groups` (alive), `remote_restarts`, and per group
`remote/<i>/env_steps_per_s`, `remote/<i>/lag_mean`, `remote/<i>/node`. Torch-free and Ray-free (the runner imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RemoteTally:
    def __init__(self, groups: int):
        self.groups = groups
        self._reset()
        self.nodes: dict[int, str] = {}
        self.alive = groups
        self.restarts = 0

    def _reset(self) -> None:
        self.steps = self.slots = self.bytes = 0
        self.wait_slot = self.t_total = 0.0
        self.per_group: dict[int, dict[str, float]] = {}

    def add(self, payload: Mapping[str, Any]) -> None:
        """One bridge report (its interval's sums and its groups' counts)."""
        self.steps += int(payload.get("env_steps", 0))
        self.slots += int(payload.get("slots", 0))
        self.bytes += int(payload.get("bytes", 0))
        self.wait_slot += float(payload.get("t_wait_slot", 0.0))
        self.t_total += float(payload.get("t_total", 0.0))
        groups = payload.get("groups", {})
        if groups:
            self.alive = sum(bool(g["alive"]) for g in groups.values())
            self.restarts = sum(int(g["restarts"]) for g in groups.values())
        for i, g in groups.items():
            mine = self.per_group.setdefault(int(i), {"env_steps": 0, "lag_sum": 0, "lag_n": 0, "lag_max": 0})
            mine["env_steps"] += g["env_steps"]
            mine["lag_sum"] += g["lag_sum"]
            mine["lag_n"] += g["lag_n"]
            mine["lag_max"] = max(mine["lag_max"], g["lag_max"])
            if g["node"] != "?":
                self.nodes[int(i)] = g["node"]

    def record(self, elapsed: float, interval_steps: int) -> dict[str, Any]:
        """The interval's keys (see the module's docstring); the tally starts a new interval."""
        if not self.groups:
            return {}
        lag_n = sum(g["lag_n"] for g in self.per_group.values())
        out: dict[str, Any] = {
            "remote_env_steps_per_s": self.steps / elapsed,
            "remote_slots_per_s": self.slots / elapsed,
            "remote_bytes_per_s": self.bytes / elapsed,
            "remote_share": self.steps / interval_steps if interval_steps > 0 else None,
            "remote_lag_mean": sum(g["lag_sum"] for g in self.per_group.values()) / lag_n if lag_n else None,
            "remote_lag_max": max((g["lag_max"] for g in self.per_group.values() if g["lag_n"]), default=None),
            "remote_wait_slot_frac": self.wait_slot / self.t_total if self.t_total > 0 else None,
            "remote_groups": self.alive,
            "remote_restarts": self.restarts,
        }
        for i, g in sorted(self.per_group.items()):
            out[f"remote/{i}/env_steps_per_s"] = g["env_steps"] / elapsed
            out[f"remote/{i}/lag_mean"] = g["lag_sum"] / g["lag_n"] if g["lag_n"] else None
            out[f"remote/{i}/node"] = self.nodes.get(i, "?")
        self._reset()
        return out
