"""APPO's settings per env family, chosen from the env (asyncrl/presets.py): the Config defaults are tuned for
Atari; low-dimensional control gets its own. Torch-free."""

from __future__ import annotations

from typing import Any

# --rnn units after an MLP encoder of vector observations (the 512 default follows the CNN's 512 features). On the
# cue-then-question memory task (tests/memory_envs.py) a GRU of 128 answered as soon as one of 512 (13.3k against
# 17.7k env steps to 0.9) at 3.7x its env steps/s (docs/models.md).
VECTOR_RNN = 128

# Vector observations, MLP policy (custom envs, CartPole stepped one at a time). Many small updates per sample; a low
# value weight because policy and value share the MLP trunk and unscaled returns would swamp the policy.
# Advantages are not scaled up past a std of 1 reward unit: on a solved task (no entropy bonus) they are noise,
# which normalised to unit size flipped a deterministic policy's choice for good (docs/results.md).
VECTOR: dict[str, Any] = {
    "workers": 2, "envs_per_worker": 8, "rollout": 16, "batch_size": 256, "epochs": 8, "minibatches": 2,
    "lr": 1e-3, "lr_schedule": "auto",
    "value_coeff": 0.05, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.98, "vtrace_c": 0.8,
    "rnn_size": VECTOR_RNN, "adv_std_floor": 1.0,
}

FAMILY_PRESETS: dict[str, dict[str, Any]] = {
    # Frames standardised per pixel (--normalize-obs, Sample Factory's Atari setting): on Pong the mean of the last
    # 100 games passed -19.5 at 0.65-0.85M frames where pixels / 255 took 3.75-4.58M (docs/results.md). A user's
    # --encoder module gets the frames as the env gives them unless --normalize-obs is given (asyncrl/resolve.py).
    "atari": {"normalize_obs": True},
    # VizDoom frames go through the same Nature CNN; Atari's settings, with rewards scaled per scenario in
    # asyncrl/envs/doom.py (SCENARIOS) instead of clipped.
    "doom": {},
    "vector": VECTOR,
    # Box actions on vector observations (Pendulum, custom control envs): the vector preset with rewards divided by
    # a running RMS of the returns. Pendulum-v1 to -200 within 1M env steps: 3 of 3 seeds at 785k-971k without it
    # and falling back (ca87b2f); with it, docs/results.md.
    "vector_continuous": {**VECTOR, "normalize_returns": True},
    # The vector preset for a batched env (one VectorEnv per worker split: CartPole-v1 by default, gymnax ids, a
    # module:callable returning a VectorEnv): envs cost little each, so 4x the envs and an 8x batch, far fewer
    # optimizer steps per sample (6 epochs of 2 minibatches of 1,024), and the vector preset's rate scaled by the
    # sqrt rule for the 8x batch. gamma 0.99 and V-trace's c 1.0 (IMPALA's): with 0.98 and 0.8, `asyncrl-train --env
    # CartPole-v1 --frames 300000` reached a mean return of 475 on 12 of 12 seeds forked but 9 of 12 with --serial
    # (which acts at the forked run's lag of 2); with these, 12 of 12 in both (docs/configuration.md).
    "vector_batched": {
        "workers": 2, "envs_per_worker": 64, "rollout": 16, "batch_size": 2048, "epochs": 6, "minibatches": 2,
        "lr": 2.8e-3, "lr_schedule": "auto",
        "value_coeff": 0.05, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.99, "vtrace_c": 1.0,
        "rnn_size": VECTOR_RNN,
    },
    # gymnax's MinAtar games (gymnax:Breakout-MinAtar, ...; 10 x 10 grids through the MLP): gymnax-blines' PPO
    # settings (64 envs x 128 steps, 4 epochs of 8 minibatches, lr 5e-4, gamma 0.999, entropy 0.01, 2 x 256 units)
    # with ReLU units. With tanh units the same settings reached an IQM of 12.96 at 3M env steps on Breakout, with
    # ReLU 24.31 (3 seeds each, docs/notes/results-mujoco-gymnax.md); the published baseline reads 16.5 there.
    "gymnax_minatar": {
        "workers": 2, "envs_per_worker": 32, "rollout": 128, "batch_size": 8192, "epochs": 4, "minibatches": 8,
        "lr": 5e-4, "lr_schedule": "constant", "gamma": 0.999, "vtrace_c": 0.95, "clip_ratio": 0.2,
        "entropy_coeff": 0.01, "value_coeff": 0.5, "max_grad_norm": 0.5, "hidden_size": 256, "activation": "relu",
    },
    # gymnasium's MuJoCo locomotion tasks (HalfCheetah, Hopper, Walker2d, Ant, Humanoid): PPO's continuous-control
    # settings (normalised observations and returns, long rollouts, 10 epochs of 256-sample minibatches, no entropy
    # bonus). Return normalisation took Hopper-v5 from 550 to over 2,000 at 1M steps (docs/results.md).
    "mujoco": {
        "workers": 2, "envs_per_worker": 0, "rollout": 64, "batch_size": 2048, "epochs": 10, "minibatches": 8,
        "lr": 3e-4, "lr_schedule": "auto", "normalize_obs": True, "normalize_returns": True,
        "value_coeff": 0.5, "max_grad_norm": 0.5, "entropy_coeff": 0.0, "gamma": 0.99, "vtrace_c": 0.95,
        "clip_ratio": 0.2, "rnn_size": VECTOR_RNN,
    },
}
