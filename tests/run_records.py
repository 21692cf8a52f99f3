"""Synthetic run records for the diagnostics tests: stage-time fractions, healthy metrics.jsonl records, and the
stand-ins for a run's queues and learner process that `RunMonitor` samples."""

from __future__ import annotations

import os


def fractions(env=None, infer=None, lwait=None, copy=None, train=None) -> dict:
    return {"rollout_env_frac": env, "rollout_wait_frac": None if env is None else 1 - env,
            "policy_infer_frac": infer, "policy_wait_frac": None if infer is None else 1 - infer,
            "learner_wait_frac": lwait, "learner_copy_frac": copy, "learner_train_frac": train}



def run_records(n: int, **series) -> list[dict]:
    """n healthy records; keyword args override a key with a list (or a function of the index)."""
    recs = []
    for i in range(n):
        r = {"time": 5.0 * (i + 1), "frames": 10_000 * (i + 1), "fps": 2000.0, "episode_return_mean": 10.0 + i,
             "entropy": 0.6, "kl": 0.001, "grad_norm": 5.0, "grad_norm_max": 6.0, "value_loss": 10.0,
             "policy_loss": 0.01, "nonfinite_updates": 0, "rss_mb_total": 800.0, "queue_full": 1.0,
             "queue_requests": 2.0, "queue_reports": 0.0}
        for key, values in series.items():
            r[key] = values(i) if callable(values) else values[i] if isinstance(values, list) else values
        recs.append(r)
    return recs


class FakeQueue:
    def __init__(self, n: int) -> None:
        self.n = n

    def qsize(self) -> int:
        return self.n


class FakeChannels:
    def __init__(self) -> None:
        self.requests, self.full, self.free, self.reports = FakeQueue(3), FakeQueue(1), FakeQueue(0), FakeQueue(0)


class FakeProc:
    pid = os.getpid()
