"""What to try next: the user guide's debugging decision tree, walked over a run's records.

    poor performance -> returns rising?
        no  -> value function learning (value loss falling)?
                 no  -> check the data pipeline: are observations, rewards and dones right?
                 yes -> entropy normal?  too low -> raise the entropy bonus, lower the learning rate
                                         normal  -> train longer, try a curriculum
        yes but slowly -> check reward shaping, tune hyperparameters
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

RISING, SLOW, FLAT, FALLING, UNKNOWN = "rising", "rising slowly", "flat", "falling", "unknown"


def trend(values: Sequence[float], min_points: int = 6) -> str:
    """Compare the mean of the last third with the first third, relative to the series' scale."""
    xs = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    if len(xs) < min_points:
        return UNKNOWN
    third = len(xs) // 3
    early, late = statistics.fmean(xs[:third]), statistics.fmean(xs[-third:])
    scale = max(abs(early), statistics.pstdev(xs), 1e-8)
    change = (late - early) / scale
    if change > 0.2:
        return RISING
    if change > 0.05:
        return SLOW
    if change < -0.05:
        return FALLING
    return FLAT


def _values(records: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in records if isinstance(r.get(key), int | float)]


def next_steps(records: Sequence[dict[str, Any]], entropy_floor: float | None = None) -> list[str]:
    """The decision tree's path for this run, one step per line (last line: what to try)."""
    returns = trend(_values(records, "episode_return_mean"))
    path = [f"Are returns rising? **{returns}**."]
    if returns == UNKNOWN:
        return path + ["Too few reports with finished episodes to judge: train longer (or lower "
                       "--report-interval) and diagnose again."]
    if returns == RISING:
        return path + ["Learning works. Keep training; to get there faster, remove the throughput bottleneck "
                       "above, and scale the learning rate with the batch (about sqrt(k) for a k-times "
                       "larger --batch-size)."]
    if returns == SLOW:
        return path + ["Rising but slowly: check reward shaping (sparse or badly scaled rewards), then tune "
                       "hyperparameters: --lr, --rollout, --batch-size, --epochs, --entropy-coeff, --gamma."]
    value = trend(_values(records, "value_loss"))
    path.append(f"Is the value function learning (value loss falling or steady)? value loss is **{value}**.")
    if value == UNKNOWN:
        return path + ["Too few reports with a value loss to judge: train longer and diagnose again."]
    learning = value in (FALLING, FLAT)
    if not learning:
        return path + ["No: check the data pipeline. Are observations what the env shows (frame stacking, "
                       "scaling, --normalize-obs), are rewards finite and sensibly scaled, do episodes end "
                       "(dones)? Train on a known-good env (CartPole-v1, atari_pong) with the same settings to "
                       "separate env problems from trainer problems."]
    entropies = _values(records, "entropy")
    if not entropies:
        return path + ["No entropy reported: the learner has not trained yet."]
    low = entropy_floor is not None and entropies[-1] < 2 * entropy_floor
    path.append(f"Is the policy entropy normal? latest {entropies[-1]:.3g} is **{'too low' if low else 'normal'}**"
                + (f" (collapse below {entropy_floor:.3g})." if entropy_floor is not None else "."))
    if low:
        return path + ["Raise --entropy-coeff (e.g. x3) and lower --lr (e.g. /3), then resume or restart."]
    return path + ["Train longer, or make the task easier first (curriculum: shorter episodes, denser "
                   "rewards), then scale back up."]
