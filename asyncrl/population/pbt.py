"""Population-based training (Jaderberg et al. 2017), decided in the runner, carried out by the learner.

Every `--pbt-period` frames the policies are ranked by their objective (the mean return of their last 100
episodes, or the env's `true_objective` where its episodes report one). Each of the worst `--pbt-fraction`
(at least one) copies the weights and optimizer state of one of the best as many (exploit), when that one's
objective is ahead by more than `--pbt-gap` of its own magnitude, and trains on with the source's settings
each multiplied or divided by 1.2 (explore; gamma through 1 - gamma, kept below 1).
The learner gets the command on its queue; each round and each copy is a line of `pbt.jsonl` in the run dir.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Sequence

from asyncrl.config import Config
from asyncrl.diagnostics.aggregate import PolicyTotals

PERTURB = 1.2
MAX_GAMMA = 0.9999


def perturbed(settings: dict[str, float], rng: random.Random) -> dict[str, float]:
    """Each setting times or divided by PERTURB (for gamma: its horizon, 1 - gamma)."""
    out = {}
    for key, value in settings.items():
        factor = PERTURB if rng.random() < 0.5 else 1 / PERTURB
        out[key] = min(MAX_GAMMA, 1 - (1 - value) * factor) if key == "gamma" else value * factor
    return out


class PopulationTrainer:
    """The exploit/explore schedule over the population; `tick` once per runner loop."""

    def __init__(self, cfg: Config, settings: list[dict[str, float]], frames: int,
                 send: Callable[[tuple], None]) -> None:
        self.period, self.fraction, self.gap = cfg.pbt_period, cfg.pbt_fraction, cfg.pbt_gap
        self.settings = [dict(s) for s in settings]
        self.next_round = frames + self.period
        self.rng = random.Random(cfg.seed)
        self.send = send
        self.path = os.path.join(cfg.run_dir, "pbt.jsonl")
        self.started = time.time()

    def tick(self, frames: int, policies: Sequence[PolicyTotals]) -> None:
        if frames < self.next_round:
            return
        scores = [m.score() for m in policies]
        if any(s is None for s in scores):  # a policy without a finished episode yet: try again shortly
            return
        self.next_round = frames + self.period
        order = sorted(range(len(scores)), key=lambda p: scores[p])
        k = max(1, int(len(scores) * self.fraction))
        worst, best = order[:k], order[-k:]
        self._write({"event": "round", "frames": frames, "scores": scores, "settings": self.settings})
        for into in worst:
            source = self.rng.choice(best)
            if scores[source] - scores[into] <= max(self.gap * abs(scores[into]), 1e-6):
                continue  # a near-tie: copying would only churn
            new = perturbed(self.settings[source], self.rng)
            self.send(("pbt", into, source, new))
            self._write({"event": "exploit", "frames": frames, "policy": into, "from": source,
                         "score": scores[into], "from_score": scores[source], "settings_before": self.settings[into],
                         "settings": new})
            self.settings[into] = new
            policies[into].returns.clear()  # its episodes were played by the weights it just gave up
            policies[into].objective.clear()

    def _write(self, event: dict) -> None:
        event = {"time": round(time.time() - self.started, 3), **event}
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def read_events(run_dir: str) -> list[dict]:
    """The run's pbt.jsonl, oldest first ([] without one)."""
    path = os.path.join(run_dir, "pbt.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
