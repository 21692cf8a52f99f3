"""Q divergence: how far the critics' estimates drift above the discounted returns the replay data actually got.

High update-to-data ratios overfit the critics (Chen et al. 2021, "REDQ", section 3; Nikishin et al. 2022):
their Q estimates rise above the returns obtained. This module measures that on replay data:

* `episode_returns` walks each sampled transition forward through its episode in the replay ring (the
  segments of one env are linked by `ReplayBuffer.next_segment`) and sums the discounted rewards, the
  Monte-Carlo return G (for a soft critic, SAC's, with the entropy bonus of the actions taken after the
  first). A terminated episode gives G exactly. A time-limit cut is bootstrapped: G gains
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
                    max_bootstrap_weight: float = MAX_BOOTSTRAP_WEIGHT, bonus: np.ndarray | None = None,
                    max_steps: int = 10_000) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Discounted returns from the transitions at flat `indices` (`segment * T + step`) of `[S, T]` arrays.

    `next_segment[s]` is the segment that continues segment s's env (-1: none held). `bonus` (`[S, T]`, e.g.
    SAC's entropy bonus `-alpha log pi(a_k|s_k)`) is added to every reward after the first, as a soft Q counts
    it: `G = r_t + sum_{k>t} gamma^(k-t) (r_k + bonus_k)`. Returns
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
    pos = np.arange(t_len)
    active = np.arange(n)
    for _ in range(max_steps // t_len + 1):  # one segment per pass, all samples at once
        if not len(active):
            break
        s, t = seg[active], step[active]
        rows = np.arange(len(active))
        bad, term, trunc = ~sampleable[s], terminated[s], truncated[s]  # [m, T]
        ahead = pos[None, :] >= t[:, None]
        stop = (bad | term | trunc) & ahead
        stops = stop.any(axis=1)
        end = np.where(stops, stop.argmax(axis=1), t_len - 1)  # the last step of this pass
        taken = ahead & (pos[None, :] <= end[:, None])
        powers = gamma ** np.maximum(pos[None, :] - t[:, None], 0)
        gain = rewards[s] if bonus is None else rewards[s] + bonus[s]
        returns[active] += discount[active] * (gain * powers * taken).sum(axis=1)
        discount[active] *= gamma ** (end - t + 1)
        # an unsampleable step (env error, lost final obs) leaves the transition out; else an episode end
        ended_bad = stops & bad[rows, end]
        ended_term = stops & ~ended_bad & term[rows, end]
        ended_cut = stops & ~ended_bad & ~ended_term
        complete[active[ended_term]] = True
        cut_ids = active[ended_cut]
        keep = discount[cut_ids] <= max_bootstrap_weight
        complete[cut_ids[keep]] = True
        boot_index[cut_ids[keep]] = (s * t_len + end)[ended_cut][keep]
        boot_weight[cut_ids[keep]] = discount[cut_ids[keep]]
        nxt = next_segment[s[~stops]]
        active = active[~stops][nxt >= 0]  # the env's next segment is not in the buffer (yet): left out
        seg[active] = nxt[nxt >= 0]
        step[active] = 0
    if bonus is not None:  # the first step's own bonus is not part of Q(s_t, a_t)
        returns -= bonus.flat[indices]
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
