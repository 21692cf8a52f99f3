"""Q divergence: how far the critics' estimates drift above the discounted returns the replay data actually got.

High update-to-data ratios overfit the critics (Chen et al. 2021, "REDQ", section 3; Nikishin et al. 2022):
their Q estimates rise above the returns obtained. This module measures that on replay data:

* `episode_returns` walks each sampled transition forward through its episode in the replay ring (the
  segments of one env are linked by `ReplayBuffer.next_segment`) and sums the discounted rewards, the
  Monte-Carlo return G. A terminated episode gives G exactly. A time-limit cut is bootstrapped: G gains
  `gamma^k V(s_cut)` (k steps to the cut, V from the critic, filled in by the caller), and the transition
  is kept only while that bootstrap weight is at most `max_bootstrap_weight`, so the critic being judged
  supplies at most half of the return it is judged against. Transitions whose episode is not complete in
  the buffer (the env has not finished it yet, an unsampleable step, a missing link) are left out.
* `ensemble_estimate` reduces the critic ensemble as the learner's target does: the min over all K critics
  (SAC, TD3), or the expected min over a random subset of M (REDQ), computed exactly from order statistics.
* `divergence` is the relative overestimate `mean(Q - G) / max(mean |G|, 1)`.

Pure numpy over the buffer's arrays; no torch, no buffer object.
"""

from __future__ import annotations

import math

import numpy as np

MAX_BOOTSTRAP_WEIGHT = 0.5  # keep a time-limit-cut transition only while gamma^k (the critic's share) <= this


def episode_returns(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, sampleable: np.ndarray,
                    next_segment: np.ndarray, indices: np.ndarray, gamma: float,
                    max_bootstrap_weight: float = MAX_BOOTSTRAP_WEIGHT,
                    max_steps: int = 10_000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Discounted returns from the transitions at flat `indices` (`segment * T + step`) of `[S, T]` arrays.

    `next_segment[s]` is the segment that continues segment s's env (-1: none held). Returns
    `(returns, complete, bootstrap_index, bootstrap_weight)`, each `[n]`: the reward sum (without the
    bootstrap), whether the return is usable, and for a time-limit cut the flat index of the cut transition
    (whose final observation the caller values) and its weight `gamma^k` (else -1 and 0). Incomplete entries
    hold 0.
    """
    segments, t_len = rewards.shape
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    returns = np.zeros(n)
    complete = np.zeros(n, dtype=bool)
    boot_index = np.full(n, -1, dtype=np.int64)
    boot_weight = np.zeros(n)
    seg, step = np.divmod(indices, t_len)
    discount = np.ones(n)
    active = np.arange(n)
    for _ in range(max_steps):
        if not len(active):
            break
        s, t = seg[active], step[active]
        ok = sampleable[s, t]
        active, s, t = active[ok], s[ok], t[ok]  # an unsampleable step (env error, lost final obs): left out
        returns[active] += discount[active] * rewards[s, t]
        discount[active] *= gamma
        term, trunc = terminated[s, t], truncated[s, t]
        complete[active[term]] = True
        cut = trunc & ~term
        cut_ids = active[cut]
        keep = discount[cut_ids] <= max_bootstrap_weight
        complete[cut_ids[keep]] = True
        boot_index[cut_ids[keep]] = s[cut][keep] * t_len + t[cut][keep]
        boot_weight[cut_ids[keep]] = discount[cut_ids[keep]]
        going = ~(term | trunc)
        active, s, t = active[going], s[going], t[going]
        at_end = t == t_len - 1
        nxt = np.where(at_end, next_segment[s], s)
        linked = nxt >= 0  # the env's next segment is not in the buffer (yet): left out
        active = active[linked]
        seg[active] = nxt[linked]
        step[active] = np.where(at_end[linked], 0, t[linked] + 1)
    returns[~complete] = 0.0
    return returns, complete, boot_index, boot_weight


def ensemble_estimate(q: np.ndarray, subset_size: int | None = None) -> np.ndarray:
    """`[K, B]` critic values -> `[B]`: min over all K, or the expected min over a uniform random M-subset.

    With the values sorted ascending, the k-th smallest (0-based) is the subset's min with probability
    `C(K - 1 - k, M - 1) / C(K, M)`.
    """
    q = np.asarray(q, dtype=np.float64)
    if q.ndim == 1:
        return q
    k = q.shape[0]
    m = k if subset_size is None else subset_size
    if not 1 <= m <= k:
        raise ValueError(f"subset size {m} must be in [1, {k}]")
    if m == k:
        return q.min(axis=0)
    weights = np.array([math.comb(k - 1 - i, m - 1) for i in range(k)], dtype=np.float64) / math.comb(k, m)
    return (np.sort(q, axis=0) * weights[:, None]).sum(axis=0)


def divergence(q: np.ndarray, returns: np.ndarray) -> dict[str, float]:
    """`q_mean`, `q_return_mean` and `q_divergence = mean(Q - G) / max(mean |G|, 1)` (empty input: {})."""
    q, g = np.asarray(q, dtype=np.float64), np.asarray(returns, dtype=np.float64)
    if not len(g):
        return {}
    scale = max(float(np.abs(g).mean()), 1.0)
    return {"q_mean": float(q.mean()), "q_return_mean": float(g.mean()),
            "q_divergence": float((q - g).mean() / scale)}
