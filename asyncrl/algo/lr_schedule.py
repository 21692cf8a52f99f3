"""Learning-rate schedules: linear decay, a linear warm-up, and the KL-adaptive rule (rl_games' `adaptive`).

The KL-adaptive rule keeps the policy's step size near a target: after each update it compares the measured
KL(behaviour || current) with `target` and multiplies or divides the rate by `factor` when the KL is off by
more than 2x, within [lr_min, lr_max]. In an asynchronous trainer that KL also grows with policy lag, so
the rule slows learning down by itself when samples arrive stale.
"""

from __future__ import annotations

KL_FACTOR = 1.5  # change per update when the KL is off target
KL_RANGE = (0.01, 10.0)  # bounds on the adaptive rate, as multiples of the configured --lr


def linear_lr(base_lr: float, frames: int, total_frames: int) -> float:
    """Decays from `base_lr` to 0 at `total_frames`."""
    return base_lr * max(0.0, 1.0 - frames / total_frames)


def warmup_factor(frames: int, warmup_frames: int) -> float:
    """The share of the scheduled rate in force after `frames` of a linear warm-up over `warmup_frames` (0: none)."""
    return min(1.0, frames / warmup_frames) if warmup_frames > 0 else 1.0


def kl_adaptive_lr(lr: float, kl: float, target: float, lr_min: float, lr_max: float,
                   factor: float = KL_FACTOR) -> float:
    """The next learning rate: lower when `kl` > 2 x target, higher when `kl` < target / 2."""
    if kl > 2.0 * target:
        lr /= factor
    elif kl < 0.5 * target:
        lr *= factor
    return min(max(lr, lr_min), lr_max)
