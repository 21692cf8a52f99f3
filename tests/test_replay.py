"""Replay buffer, sum-tree and prioritized replay."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from asyncrl.config import ConfigError
from asyncrl.replay.buffer import ReplayBuffer, check_fits, memory_bytes
from asyncrl.replay.prioritized import PrioritizedReplay
from asyncrl.replay.sum_tree import SumTree

FORK = mp.get_context("fork")


class ChunkSource:
    """B envs emitting unique observation ids, with terminations, time-limit truncations and same-step reset.

    Records, per insert index, what each transition must read back: (obs id, true next obs id, flags).
    """

    def __init__(self, envs: int, time_limit: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.envs, self.time_limit = envs, time_limit
        self.next_id = 0
        self.current = self._new_ids(envs)
        self.ep_len = np.zeros(envs, np.int64)
        self.inserted = 0
        self.expected: dict[int, tuple[int, int, bool, bool]] = {}

    def _new_ids(self, n: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + n)
        self.next_id += n
        return ids

    def chunk(self, t_len: int) -> dict[str, np.ndarray]:
        b = self.envs
        obs = np.zeros((t_len + 1, b, 2), np.float32)
        term = np.zeros((t_len, b), bool)
        trunc = np.zeros((t_len, b), bool)
        finals = []
        obs[0, :, 0] = self.current
        for t in range(t_len):
            stepped = self._new_ids(b)
            self.ep_len += 1
            term[t] = self.rng.random(b) < 0.05
            trunc[t] = ~term[t] & (self.ep_len >= self.time_limit)
            done = term[t] | trunc[t]
            nxt = stepped.copy()
            nxt[done] = self._new_ids(int(done.sum()))  # same-step auto-reset: the slot holds the reset obs
            for j in range(b):
                true_next = stepped[j]
                self.expected[self.inserted + t * b + j] = (int(obs[t, j, 0]), int(true_next), term[t, j], trunc[t, j])
                if trunc[t, j]:
                    finals.append((t, j, stepped[j]))
            self.ep_len[done] = 0
            obs[t + 1, :, 0] = nxt
        obs[..., 1] = 7.0
        finals.sort()
        final_obs = np.array([[f, 7.0] for _, _, f in finals], np.float32).reshape(-1, 2)
        self.current = obs[t_len, :, 0].astype(np.int64)
        self.inserted += t_len * b
        actions = obs[:-1, :, :1] * 2  # action = 2 x obs id, shape [T, B, 1]
        return dict(obs=obs, actions=actions, rewards=obs[:-1, :, 0] + 0.5, terminated=term, truncated=trunc,
                    versions=np.arange(t_len) + self.inserted, final_obs=final_obs)


def check_transitions(buf: ReplayBuffer, src: ChunkSource, indices: np.ndarray) -> None:
    batch = buf.gather(indices)
    for i in range(len(indices)):
        obs_id, next_id, term, trunc = src.expected[int(batch.insert_index[i])]
        assert batch.obs[i, 0] == obs_id
        if not term:  # after a terminated step the next obs is never used (no bootstrap)
            assert batch.next_obs[i, 0] == next_id, (i, trunc)
        assert (batch.terminated[i], batch.truncated[i]) == (term, trunc)
        assert batch.actions[i, 0] == 2 * obs_id and batch.rewards[i] == obs_id + 0.5


def test_ring_wraps_overwriting_the_oldest_with_next_obs_right_across_wrap_and_episode_ends() -> None:
    src = ChunkSource(envs=3, time_limit=5)
    buf = ReplayBuffer(capacity=40, obs_shape=(2,), obs_dtype=np.float32, action_shape=(1,), segment_len=4,
                       final_obs_capacity=64)
    assert buf.capacity == 40 and buf.segments == 10
    for _ in range(9):  # 9 chunks x 3 columns = 27 segments into a ring of 10: wraps twice
        buf.insert(**src.chunk(4))
    assert buf.size == 40 and buf.inserted == 108
    held = np.arange(buf.capacity)
    index = buf.insert_index.ravel()  # chunk k, step t, env j was insert index 12 k + 3 t + j
    columns = index // 12 * 3 + index % 3
    assert set(columns.tolist()) == set(range(17, 27))  # exactly the newest 10 of the 27 columns are held
    ages = buf.age(buf.gather(held))
    assert ages.min() == 0 and ages.max() == buf.inserted - 1 - (5 * 12 + 2)  # oldest: chunk 5, env 2, step 0
    assert buf.truncated.any() and buf.terminated.any()
    check_transitions(buf, src, held)
    assert buf.final_obs_evicted == 0 and buf.sampleable.all()


def test_oldest_segments_are_the_ones_overwritten() -> None:
    buf = ReplayBuffer(capacity=8, obs_shape=(), obs_dtype=np.int64, segment_len=2)
    for k in range(3):  # chunks of 2 columns; the ring holds 4 segments
        obs = np.full((3, 2), k)
        buf.insert(obs, np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2), bool), np.zeros((2, 2), bool))
    assert sorted(buf.obs[:, 0].tolist()) == [1, 1, 2, 2]  # chunk 0 is gone, written over first


def test_truncated_steps_keep_their_final_obs_and_evictions_make_them_unsampleable() -> None:
    src = ChunkSource(envs=2, time_limit=2)
    buf = ReplayBuffer(capacity=32, obs_shape=(2,), obs_dtype=np.float32, action_shape=(1,), segment_len=4,
                       final_obs_capacity=5)
    for _ in range(6):
        buf.insert(**src.chunk(4))
    assert buf.final_obs_evicted > 0
    lost = ~buf.sampleable.ravel()
    assert lost.sum() > 0 and buf.truncated.ravel()[lost].all()
    kept = np.flatnonzero(buf.sampleable.ravel())
    check_transitions(buf, src, kept)
    assert (buf.final_slot.ravel()[kept][buf.truncated.ravel()[kept]] >= 0).all()
    drawn = buf.sample_indices(2000, np.random.default_rng(0))
    assert buf.sampleable.ravel()[drawn].all()


def test_frames_are_stored_once_per_step() -> None:
    shape = (4, 84, 84)
    naive = 1000 * 2 * int(np.prod(shape))  # obs + a duplicated next_obs per transition
    ours = memory_bytes(1000, shape, np.uint8, (), np.int64, segment_len=32)
    assert ours < 0.56 * naive
    buf = ReplayBuffer(1000, shape, np.uint8, (), np.int64, segment_len=32)
    assert buf.obs.shape == (32, 33, *shape)


def test_memory_estimate_matches_allocation_and_too_large_is_refused() -> None:
    args = (5000, (3,), np.float32, (1,))
    buf = ReplayBuffer(*args, shared=True)
    assert memory_bytes(*args) == buf.nbytes
    check_fits(memory_bytes(*args))
    too_big = memory_bytes(10**9, (4, 84, 84), np.uint8, ())
    with pytest.raises(ConfigError, match=r"needs .* GiB but only .* lower the replay capacity") as err:
        check_fits(too_big)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        check_fits(900, available=1000)


def test_shared_buffer_inserted_in_a_child_is_sampled_in_the_parent() -> None:
    src = ChunkSource(envs=4, time_limit=3)
    chunks = [src.chunk(8) for _ in range(3)]
    buf = ReplayBuffer(1024, (2,), np.float32, (1,), segment_len=8, shared=True)

    def child() -> None:
        for c in chunks:
            buf.insert(**c)
        os._exit(0)

    proc = FORK.Process(target=child)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert buf.size == 96 and buf.inserted == 96
    check_transitions(buf, src, buf.sample_indices(200, np.random.default_rng(1)))


def test_bad_chunks_are_rejected() -> None:
    buf = ReplayBuffer(64, (), np.float32, segment_len=4)
    z = np.zeros((4, 2))
    with pytest.raises(ValueError, match="segment_len"):
        buf.insert(np.zeros((4, 2)), z[:3], z[:3], z[:3] > 0, z[:3] > 0)
    trunc = np.zeros((4, 2), bool)
    trunc[1, 0] = True
    with pytest.raises(ValueError, match="final observations"):
        buf.insert(np.zeros((5, 2)), z, z, z > 0, trunc)
    with pytest.raises(ValueError, match="empty"):
        buf.sample_indices(1, np.random.default_rng(0))


# --- sum-tree and prioritized replay ---------------------------------------------------------------------------



def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1 % point of chi-square(df), Wilson-Hilferty approximation (z = 3.09)."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def test_sum_tree_samples_in_proportion_to_priority() -> None:
    rng = np.random.default_rng(0)
    prios = rng.random(37) * 10
    prios[[3, 20]] = 0.0
    tree = SumTree(37)
    tree.update(np.arange(37), prios)
    counts = np.zeros(37)
    for _ in range(50):
        np.add.at(counts, tree.sample(4000, rng), 1)
    assert counts[[3, 20]].sum() == 0
    expected = prios / prios.sum() * counts.sum()
    nz = expected > 0
    chi2 = ((counts[nz] - expected[nz]) ** 2 / expected[nz]).sum()
    assert chi2 < chi_square_critical(int(nz.sum()) - 1)
    # the descent agrees exactly with a searchsorted over the cumulative sums
    q = rng.random(10_000) * tree.total
    np.testing.assert_array_equal(tree.find(q), np.searchsorted(np.cumsum(prios), q, side="right"))


def test_sum_tree_updates_with_duplicates_keep_every_node_the_sum_of_its_children() -> None:
    rng = np.random.default_rng(1)
    tree = SumTree(100)
    shadow = np.zeros(100)
    for _ in range(200):
        idx = rng.integers(0, 100, 64)  # plenty of duplicates
        val = rng.random(64)
        tree.update(idx, val)
        for i, v in zip(idx, val):  # sequential reference: the last write wins
            shadow[i] = v
    np.testing.assert_array_equal(tree.get(np.arange(100)), shadow)
    inner = np.arange(1, tree.leaves)
    np.testing.assert_allclose(tree.tree[inner], tree.tree[2 * inner] + tree.tree[2 * inner + 1], rtol=1e-12)
    assert tree.total == pytest.approx(shadow.sum(), rel=1e-12)
    tree.update([5, 5], [3.0, 1.0])
    assert tree.get([5])[0] == 1.0
    with pytest.raises(ValueError):
        tree.update([1], [-1.0])


def per_with(n_chunks: int = 1) -> PrioritizedReplay:
    buf = ReplayBuffer(capacity=8, obs_shape=(), obs_dtype=np.float32, segment_len=2)
    per = PrioritizedReplay(buf, alpha=0.5, beta_start=0.4, beta_updates=10, eps=0.0)
    for k in range(n_chunks):
        obs = np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * k
        per.insert(obs, np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2), bool), np.zeros((2, 2), bool))
    return per


def test_per_priorities_probabilities_and_importance_weights_by_hand() -> None:
    per = per_with(2)  # 8 transitions, all at the initial max priority 1
    assert per.tree.get(np.arange(8)).tolist() == [1.0] * 8
    per.update_priorities(np.arange(8), np.array([-4.0, 1, 1, 1, 1, 1, 1, 9]))  # p^alpha: 2, 1, ..., 1, 3
    assert per.max_priority == 9.0
    rng = np.random.default_rng(0)
    batch = per.sample(3000, rng)
    freq = np.bincount(batch.indices, minlength=8) / 3000
    np.testing.assert_allclose(freq, np.array([2, 1, 1, 1, 1, 1, 1, 3]) / 11, atol=0.01)
    beta = 0.4 + 0.6 * 1 / 10  # one update of ten
    # w_i = (N P_i)^-beta / max w: the smallest priority gets weight 1, the largest (1/3)^beta
    w = dict(zip(batch.indices.tolist(), batch.weights.tolist()))
    assert w[1] == pytest.approx(1.0) and w[0] == pytest.approx(0.5 ** beta) and w[7] == pytest.approx(3 ** -beta)
    for _ in range(20):
        per.update_priorities([0], [1.0])
    assert per.beta == 1.0
    obs = np.zeros((3, 2), np.float32)
    per.insert(obs, np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2), bool), np.zeros((2, 2), bool))
    assert per.tree.get([0, 1, 2, 3]).tolist() == [3.0] * 4  # new transitions: max priority 9 ** 0.5


def test_per_never_samples_transitions_whose_final_obs_was_evicted() -> None:
    src = ChunkSource(envs=2, time_limit=2)
    buf = ReplayBuffer(capacity=32, obs_shape=(2,), obs_dtype=np.float32, action_shape=(1,), segment_len=4,
                       final_obs_capacity=5)
    per = PrioritizedReplay(buf)
    for _ in range(6):
        per.insert(**src.chunk(4))
    lost = np.flatnonzero(~buf.sampleable.ravel())
    assert len(lost) > 0
    per.update_priorities(lost, np.full(len(lost), 100.0))
    batch = per.sample(5000, np.random.default_rng(0))
    assert buf.sampleable.ravel()[batch.indices].all()
