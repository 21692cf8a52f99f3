"""`episode_return_window`: the mean return of the episodes that ended within the last WINDOW env steps, recovered
exactly from the running means the runner records (`asyncrl-compare --window`).

`episode_return_mean_20` (the last 20 episodes) lags by 20 episodes, about 4,000 env steps on Pendulum whatever
the env count; a window in env steps shows the level a short run has reached. While a run has finished at most 100
episodes, `episode_return_mean` (the last 100) times `episodes` is the sum of every return so far, so the returns
that each record adds are known exactly (per record, not per episode). Records after the 100th episode carry none.
"""

from __future__ import annotations

from typing import Any

HISTORY = 100  # episode_return_mean's window (asyncrl/diagnostics/aggregate.py keeps the last 100 returns)
METRIC = "episode_return_window"


def windowed(records: list[dict[str, Any]], window: int) -> tuple[list[dict[str, Any]], bool]:
    """The records with `episode_return_window` added, and whether the run passed HISTORY episodes."""
    groups: list[tuple[int, float, int]] = []  # (env_steps, sum of the returns added, episodes added)
    prev_sum, prev_n, cut = 0.0, 0, False
    out = []
    for rec in records:
        rec = dict(rec)
        n, mean = rec.get("episodes") or 0, rec.get("episode_return_mean")
        if n > HISTORY:
            cut = True
        elif n > prev_n and mean is not None:
            total = n * mean
            groups.append((rec["env_steps"], total - prev_sum, n - prev_n))
            prev_sum, prev_n = total, n
        if not cut and "env_steps" in rec:
            recent = [(s, k) for steps, s, k in groups if steps > rec["env_steps"] - window]
            count = sum(k for _, k in recent)
            rec[METRIC] = sum(s for s, _ in recent) / count if count else None
        out.append(rec)
    return out, cut
