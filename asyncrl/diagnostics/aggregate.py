"""The runner's tallies of its children's reports: run totals, stage-time shares and the learner's stats.

Rollout and policy workers report counters and stage times; the learner reports whatever numeric stats its
algorithm's `train` returns. `learner_stats` averages every one of them over the interval, except the keys in
the rule tables below. Torch-free (the runner imports it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Learner stats that are not averaged: the largest of the interval, or the newest (defaults when no update ran).
MAX_STATS = frozenset({"policy_lag_max"})
LAST_STATS = {"learning_rate": None, "nonfinite_updates": 0, "updates_total": None}
# Counted over the whole run by `Totals.add_learner` (the record carries the running totals).
SUMMED_STATS = ("dropped_stale", "truncations_unbootstrapped")
# Per-update figures the record has elsewhere or does not keep: the batch size, the published version, the
# loss (the sum of the terms already recorded), truncations (counted by the rollout workers as episodes
# truncated), the data-parallel hook's group counters, and APPO's V-trace checks (for tests, not metrics).
UNRECORDED_STATS = frozenset({"samples", "policy_version", "loss", "truncations", "group_env_steps", "ranks",
                              "value_target_mean", "importance_ratio_mean"})

# Stage shares cover the newest report intervals that span at least this many seconds.
STAGE_WINDOW_S = 5.0


def is_timing(key: str) -> bool:
    """Stage times (`t_wait`, `t_forward`, ...): shares of the learner's time, not averages (see monitor.py)."""
    return key.startswith("t_")


RETURN_WINDOW = 100  # episode_return_mean and episode_length_mean: the mean over the last 100 episodes


OBJECTIVE = "true_objective"  # an env's own PBT objective (info key, Sample Factory's name), when it reports one


@dataclass
class PolicyTotals:
    """One policy's share of the run (`--num-policies`): its episodes, its learner reports, its version."""

    episodes: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    lengths: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    objective: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))  # info true_objective, if any
    learner: list[dict] = field(default_factory=list)  # the interval's updates
    version: int = 0
    self_play: bool = False  # its episodes are games against the snapshot pool: their outcomes are recorded
    outcomes: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))  # 1 win, 0.5 draw, 0 loss

    def add_episode(self, episode: Sequence[Any]) -> None:
        self.episodes += 1
        self.returns.append(episode[0])
        self.lengths.append(episode[1])
        self.outcomes.append(1.0 if episode[0] > 0 else 0.5 if episode[0] == 0 else 0.0)
        extra = episode[3] if len(episode) > 3 else {}
        if OBJECTIVE in extra:
            self.objective.append(extra[OBJECTIVE])

    def record(self, prefix: str, names: Iterable[str]) -> dict[str, Any]:
        """`<prefix>episode_return_mean` and the rest of this policy's interval (its learner stats reset)."""
        out = {f"{prefix}episode_return_mean": _mean(self.returns), f"{prefix}episode_len_mean": _mean(self.lengths),
               f"{prefix}episodes": self.episodes, f"{prefix}policy_version": self.version}
        if self.self_play:  # a positive return is a win against the pool, zero a draw
            out[f"{prefix}win_rate"] = _mean(self.outcomes)
        out.update({f"{prefix}{k}": v for k, v in learner_stats(self.learner, names).items() if k != "policy"})
        self.learner = []
        return out

    def score(self) -> float | None:
        """PBT's objective: the env's true_objective where its episodes report one, else the mean return."""
        return _mean(self.objective) if self.objective else _mean(self.returns)


def _mean(values: deque) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class Totals:
    """Counters over the whole run and over the current report interval."""

    env_steps: int = 0
    env_errors: int = 0  # as reported with the env steps (for the error rate; the counters come from liveness)
    episodes: int = 0
    episodes_truncated: int = 0  # episodes a time limit cut (truncated, not terminated)
    truncations_unbootstrapped: int = 0  # trained-on truncations with no final observation (masked out)
    dropped_stale: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    lengths: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    info: dict[str, deque] = field(default_factory=dict)  # the env's episode metrics, the last 100 of each
    learner: list[dict] = field(default_factory=list)
    learner_stat_names: list[str] = field(default_factory=list)  # recorded (None) even before the first update
    rollout_time: dict[str, float] = field(
        default_factory=lambda: {"t_env": 0.0, "t_wait": 0.0, "t_wait_slot": 0.0, "t_runq": 0.0, "t_total": 0.0})
    policy_time: dict[str, float] = field(
        default_factory=lambda: {"t_infer": 0.0, "t_wait": 0.0, "t_runq": 0.0, "t_total": 0.0})
    policy_batches: list[int] = field(default_factory=lambda: [0, 0])  # batches, samples in the interval
    policy_version: int = 0
    stage_window: deque = field(default_factory=deque)  # (time, stage-time tallies) of recent intervals
    learner_shares: dict[str, float] = field(default_factory=dict)  # the newest window's with learner timings
    policies: list[PolicyTotals] = field(default_factory=list)  # --num-policies > 1: one entry per policy

    def add_rollout(self, payload: Mapping[str, Any]) -> None:
        self.env_steps += int(payload["env_steps"])
        self.env_errors += int(payload.get("env_errors", 0))
        for episode in payload["episodes"]:  # (return, length, truncated[, the env's own metrics])
            self.returns.append(episode[0])
            self.lengths.append(episode[1])
            self.episodes_truncated += bool(episode[2])
            for key, value in (episode[3] if len(episode) > 3 else {}).items():
                if key not in self.info:
                    self.info[key] = deque(maxlen=RETURN_WINDOW)
                self.info[key].append(value)
        self.episodes += len(payload["episodes"])
        for p, episode in zip(payload.get("episode_policies", ()), payload["episodes"]):
            if 0 <= p < len(self.policies):
                self.policies[p].add_episode(episode)
        for k in self.rollout_time:
            self.rollout_time[k] += payload.get(k, 0.0)

    def add_policy(self, payload: Mapping[str, Any]) -> None:
        self.policy_batches[0] += payload["batches"]
        self.policy_batches[1] += payload["samples"]
        for k in self.policy_time:
            self.policy_time[k] += payload.get(k, 0.0)

    def add_learner(self, payload: dict[str, Any]) -> None:
        self.learner.append(payload)
        self.dropped_stale += payload.get("dropped_stale", 0)
        self.truncations_unbootstrapped += payload.get("truncations_unbootstrapped", 0)
        if "policy" in payload and payload["policy"] < len(self.policies):  # one policy of several
            member = self.policies[payload["policy"]]
            member.learner.append(payload)
            member.version = payload.get("policy_version", member.version)
            self.policy_version = max(m.version for m in self.policies)  # the newest policy's version
            return
        self.policy_version = payload.get("policy_version", self.policy_version)

    def expect_learner_stats(self, names: Iterable[str]) -> None:
        """The stats the learner announced when it started (recorded as None while no update has run)."""
        self.learner_stat_names = list(names)

    def stage_fractions(self, now: float | None = None) -> dict[str, float | None]:
        """Share of wall time each process type spent in each stage (then the interval's tallies reset).

        The shares cover the newest intervals that span at least `STAGE_WINDOW_S` seconds (two intervals at the
        default 5 s report interval), not just the newest one: a stage reports its time when it ends, so an
        update or a wait longer than the report interval would otherwise leave one interval with no learner
        timings and the next with a share above 100%. The learner reports when an update ends, so an update longer
        than the window (a big model, or a learner that gets a fraction of a core on a busy machine) leaves the
        window with no learner timings: its shares are then those of the newest window that had some (the learner
        is still in the update it was in, or still waiting as it was), not None, which would leave the verdict to
        the rollout and policy workers' shares alone and misread a training-bound run.
        """
        now = time.monotonic() if now is None else now
        tally = {f"rollout_{k}": v for k, v in self.rollout_time.items()}
        tally.update({f"policy_{k}": v for k, v in self.policy_time.items()})
        for stage in ("wait", "copy", "train"):
            tally[f"learner_t_{stage}"] = sum(s.get(f"t_{stage}", 0.0) for s in self.learner)
        self.stage_window.append((now, tally))
        # Each entry covers the time since the one before it: drop the oldest while the rest still span the window.
        while len(self.stage_window) > 1 and now - self.stage_window[1][0] >= STAGE_WINDOW_S:
            self.stage_window.popleft()
        window = {k: sum(t[k] for _, t in self.stage_window) for k in tally}
        out: dict[str, float | None] = {}
        for prefix, times in (("rollout", self.rollout_time), ("policy", self.policy_time)):
            total = window[f"{prefix}_t_total"]
            for stage in times:
                if stage != "t_total":
                    value = window[f"{prefix}_{stage}"]
                    out[f"{prefix}_{stage[2:]}_frac"] = value / total if total > 0 else None
                times[stage] = 0.0
        batches, samples = self.policy_batches
        out["inference_batch_mean"] = samples / batches if batches else None
        self.policy_batches = [0, 0]
        learner_total = sum(window[f"learner_t_{stage}"] for stage in ("wait", "copy", "train"))
        if learner_total > 0:
            self.learner_shares = {f"learner_{stage}_frac": window[f"learner_t_{stage}"] / learner_total
                                   for stage in ("wait", "copy", "train")}
        for stage in ("wait", "copy", "train"):  # None until the first update has reported
            out[f"learner_{stage}_frac"] = self.learner_shares.get(f"learner_{stage}_frac")
        return out

    def info_record(self) -> dict[str, float]:
        """`info_<key>`: the mean of the last 100 episodes' values of each env metric reported so far."""
        return {f"info_{key}": sum(values) / len(values) for key, values in self.info.items()}

    def learner_record(self) -> dict[str, Any]:
        """The interval's learner stats (the announced ones first, None where no update reported them); with
        several policies, over all of their updates (stats per policy are in `policy_records`)."""
        out = learner_stats(self.learner, self.learner_stat_names)
        out.pop("policy", None)
        return out

    def policy_records(self) -> dict[str, Any]:
        """`policy_<k>/...`: each policy's episode means and interval learner stats ({} with one policy)."""
        out: dict[str, Any] = {}
        for p, member in enumerate(self.policies):
            out.update(member.record(f"policy_{p}/", self.learner_stat_names))
        if self.policies and self.policies[0].self_play:
            outcomes = [o for m in self.policies for o in m.outcomes]
            out["win_rate"] = sum(outcomes) / len(outcomes) if outcomes else None
        return out


def _recorded(key: str, value: Any) -> bool:
    return (not is_timing(key) and key not in UNRECORDED_STATS and key not in SUMMED_STATS
            and isinstance(value, (int, float)) and not isinstance(value, bool))


def learner_stats(reports: Sequence[Mapping[str, Any]], names: Iterable[str] = ()) -> dict[str, Any]:
    """Combine the learner's per-update stats: the mean of each numeric stat over the updates that reported it,
    except MAX_STATS (max) and LAST_STATS (newest). Reports with no trained stat (a sampling-only run's) count
    for nothing here."""
    trained = [s for s in reports if any(_recorded(k, v) for k, v in s.items())]
    keys = [k for k in names if not is_timing(k)]
    for s in trained:
        keys += [k for k, v in s.items() if _recorded(k, v) and k not in keys]
    out: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in trained if key in s]
        if key in LAST_STATS:
            out[key] = values[-1] if values else LAST_STATS[key]
        elif not values:
            out[key] = None
        elif key in MAX_STATS:
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out
