"""The replay learners' settings (--algo sac, td3, redq), laid over the env family's (asyncrl/presets.py).
Torch-free."""

from __future__ import annotations

from typing import Any

# --algo sac, td3, redq (continuous control, replay): one rollout worker of 8 envs and short rollouts, so each
# slot reaches the learner after 8 steps and the batch (rollout x envs = 64 env steps) is inserted and trained
# on (utd x 64 gradient updates) while the worker collects the next one; 256 x 256 networks, Adam 3e-4.
OFF_POLICY_PRESET: dict[str, Any] = {
    "workers": 1, "envs_per_worker": 8, "worker_splits": 2, "rollout": 8, "batch_size": 64,
    "hidden_size": 256, "lr": 3e-4, "lr_schedule": "constant", "gamma": 0.99,
    # PPO-only settings a family preset may set (mujoco: 8 minibatches, normalised observations and returns):
    # the replay learners neither split batches nor normalise observations or returns.
    "epochs": 1, "minibatches": 1, "normalize_obs": False, "normalize_returns": False,
}
# --algo redq on top of off_policy: 20 updates per env step, so batches of 16 env steps (2 envs, one per split)
# keep one train() call at 320 updates, well inside the run's stall rule (no new policy version for
# 2 x --hang-timeout stops the run); 64-step batches made 1,280 updates, over 60 s on a contended CPU.
ALGO_PRESETS: dict[str, dict[str, Any]] = {"redq": {"envs_per_worker": 2, "batch_size": 16}}
