"""A fixed-capacity ring of transitions that stores every observation once.

Layout (all preallocated numpy arrays, optionally in one anonymous shared mapping, see `SharedArrays`).
The buffer takes whole trajectory chunks in the learner's time-major layout: observations `[T + 1, B, ...]`,
actions / rewards / flags `[T, B]`. Each of the B columns becomes one *segment*: a row of a ring of
`S = ceil(capacity / T)` segments.

| array | shape | holds |
| --- | --- | --- |
| `obs` | `[S, T + 1, *obs_shape]` | a column's T + 1 observations: transition `(s, t)` is `obs[s, t] -> obs[s, t+1]` |
| `actions` | `[S, T, *action_shape]` | action taken at `obs[s, t]` |
| `rewards` | `[S, T]` float32 | reward after the action |
| `terminated`, `truncated` | `[S, T]` bool | the episode ended after the action (MDP end / time limit) |
| `versions` | `[S, T]` int64 | the policy version that chose the action |
| `insert_index` | `[S, T]` int64 | global transition count at insertion: sample age = `inserted - insert_index` |
| `final_slot` | `[S, T]` int32 | row of `final_obs` holding the true last observation of a truncated step, else -1 |
| `sampleable` | `[S, T]` bool | False for a truncated step whose final observation was evicted (see below) |
| `final_obs` | `[K, *obs_shape]` | side ring: the final observation of truncated steps |
| `final_owner` | `[K]` int64 | flat transition index (`s * T + t`) that owns each side-ring row, -1 free |
| `next_segment` | `[S]` int64 | the segment that continues this one's env (-1: none held yet), see below |

So the next observation is the next row of the same column, never a second copy: a chunk costs T + 1 frames
for T transitions (the bootstrap frame `obs[T]` is also the next chunk's `obs[0]`, a 1 / T overhead: 3 % at
T = 32). With same-step auto-reset, `obs[s, t + 1]` after an episode end is already the next episode's first
observation: that is harmless after a terminated step (no bootstrap) and is replaced by `final_obs` after a
truncated one, which bootstraps from the real last observation.

The side ring holds `K` final observations (default one per `FINAL_OBS_INTERVAL` transitions). Rows are
reused oldest first; a row still owned by a transition in the buffer is evicted by marking that transition
unsampleable (counted in `final_obs_evicted`), so short time limits need a larger `final_obs_capacity`.

Episodes across segments: a chunk column's first observation is its env's previous column's bootstrap
observation (the same frame, copied). On insert, each new column is linked (`next_segment`) to the one open
tail (a held segment whose last step did not end an episode and that has no successor yet) whose last
observation equals its first exactly; a column that matches no tail or several is left unlinked, so a link is
never guessed. The ring overwrites oldest first, so a link always points to a newer, still held segment.
Monte-Carlo returns over these links: `asyncrl.algo.q_divergence`.

The ring overwrites the oldest segment (T transitions at a time). Insertion is a handful of vectorised
copies per chunk; sampling gathers with fancy indexing. A single process writes (inserts); once the buffer
lives in shared memory, other processes may read the arrays and `counters`, but a reader sampling while an
insert runs may read the oldest segments half overwritten: a cross-process replay needs a per-segment
sequence number (a seqlock, as `SharedWeights` uses) or must sample only between inserts.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from asyncrl.config import ConfigError
from asyncrl.shm import SharedArrays

DEFAULT_SEGMENT_LEN = 32
MAX_OPEN_TAILS = 1024  # segments awaiting their env's next chunk (oldest dropped beyond this)
FINAL_OBS_INTERVAL = 64  # default side-ring size: one final observation per this many transitions
MEMORY_FRACTION = 0.8  # check_fits refuses buffers above this share of the available RAM

# indices into the `counters` array (single writer: the inserting process)
_NEXT_SEGMENT, _FILLED_SEGMENTS, _INSERTED, _SIDE_NEXT, _EVICTED = range(5)

Layout = Mapping[str, tuple[tuple[int, ...], np.dtype]]


def _layout(capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype, action_shape: tuple[int, ...],
            action_dtype: np.dtype, segment_len: int, final_obs_capacity: int | None) -> dict:
    if capacity < 1 or segment_len < 1:
        raise ValueError(f"capacity ({capacity}) and segment_len ({segment_len}) must be >= 1")
    segments = math.ceil(capacity / segment_len)
    k = final_obs_capacity if final_obs_capacity is not None else max(16, math.ceil(capacity / FINAL_OBS_INTERVAL))
    s, t = segments, segment_len
    return {
        "obs": ((s, t + 1, *obs_shape), np.dtype(obs_dtype)),
        "actions": ((s, t, *action_shape), np.dtype(action_dtype)),
        "rewards": ((s, t), np.dtype(np.float32)),
        "terminated": ((s, t), np.dtype(bool)),
        "truncated": ((s, t), np.dtype(bool)),
        "versions": ((s, t), np.dtype(np.int64)),
        "insert_index": ((s, t), np.dtype(np.int64)),
        "final_slot": ((s, t), np.dtype(np.int32)),
        "sampleable": ((s, t), np.dtype(bool)),
        "final_obs": ((max(k, 1), *obs_shape), np.dtype(obs_dtype)),
        "final_owner": ((max(k, 1),), np.dtype(np.int64)),
        "next_segment": ((s,), np.dtype(np.int64)),
        "counters": ((8,), np.dtype(np.int64)),
    }


def memory_bytes(capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | type, action_shape: tuple[int, ...],
                 action_dtype: np.dtype | type = np.float32, segment_len: int = DEFAULT_SEGMENT_LEN,
                 final_obs_capacity: int | None = None) -> int:
    """Bytes a `ReplayBuffer` with these arguments allocates, computed before anything is allocated."""
    layout = _layout(capacity, tuple(obs_shape), np.dtype(obs_dtype), tuple(action_shape), np.dtype(action_dtype),
                     segment_len, final_obs_capacity)
    return SharedArrays.estimate_bytes(layout)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fits(nbytes: int, what: str = "replay buffer", available: int | None = None) -> None:
    """Raise ConfigError (one line, says what to do) when `nbytes` exceeds 80 % of the available RAM."""
    if available is None:
        from asyncrl.system import available_memory  # psutil + cgroup limit

        available = available_memory()
    if nbytes > MEMORY_FRACTION * available:
        raise ConfigError(f"the {what} needs {_gib(nbytes)} but only {_gib(available)} of RAM is available "
                          f"(at most {MEMORY_FRACTION:.0%} may be used): lower the replay capacity")


@dataclass(frozen=True)
class InsertResult:
    indices: np.ndarray  # flat indices (s * T + t) of the inserted transitions, [B * T]
    evicted: np.ndarray  # flat indices of older transitions made unsampleable (their final obs was evicted)


@dataclass
class ReplayBatch:
    """A sampled batch of transitions (numpy arrays, leading dimension n)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    versions: np.ndarray
    insert_index: np.ndarray
    indices: np.ndarray  # flat buffer indices, for priority updates
    weights: np.ndarray | None = None  # importance weights (prioritized replay only)


class ReplayBuffer:
    """Ring replay buffer of `capacity` transitions (rounded up to whole segments of `segment_len`)."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | type,
                 action_shape: tuple[int, ...] = (), action_dtype: np.dtype | type = np.float32,
                 segment_len: int = DEFAULT_SEGMENT_LEN, final_obs_capacity: int | None = None,
                 shared: bool = False):
        layout = _layout(capacity, tuple(obs_shape), np.dtype(obs_dtype), tuple(action_shape),
                         np.dtype(action_dtype), segment_len, final_obs_capacity)
        if shared:
            arrays: Mapping[str, np.ndarray] = SharedArrays(layout)
            self.nbytes = arrays.nbytes  # type: ignore[attr-defined]
        else:
            arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()}
            self.nbytes = SharedArrays.estimate_bytes(layout)
        self.arrays = arrays
        self.segment_len = segment_len
        self.segments = layout["obs"][0][0]
        self.capacity = self.segments * segment_len
        self.obs_shape = tuple(obs_shape)
        self.action_shape = tuple(action_shape)
        self.obs, self.actions, self.rewards = arrays["obs"], arrays["actions"], arrays["rewards"]
        self.terminated, self.truncated = arrays["terminated"], arrays["truncated"]
        self.versions, self.insert_index = arrays["versions"], arrays["insert_index"]
        self.final_slot, self.sampleable = arrays["final_slot"], arrays["sampleable"]
        self.final_obs, self.final_owner = arrays["final_obs"], arrays["final_owner"]
        self.counters = arrays["counters"]
        self.next_segment = arrays["next_segment"]
        self.final_slot[:] = -1
        self.final_owner[:] = -1
        self.next_segment[:] = -1
        # (segment, its insert_index[segment, 0], hash of its last observation's bytes) awaiting a link
        self._open_tails: list[tuple[int, int, int]] = []

    # --- counters -------------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Transitions currently held."""
        return int(self.counters[_FILLED_SEGMENTS]) * self.segment_len

    @property
    def inserted(self) -> int:
        """Transitions inserted since creation (also the next `insert_index`)."""
        return int(self.counters[_INSERTED])

    @property
    def final_obs_evicted(self) -> int:
        return int(self.counters[_EVICTED])

    # --- insertion ------------------------------------------------------------------------------------------
    def insert(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray, versions: np.ndarray | int = 0,
               final_obs: np.ndarray | None = None) -> InsertResult:
        """Insert a time-major chunk: obs [T + 1, B, ...], actions [T, B, ...], rewards and flags [T, B].

        `versions` is [T, B], [T] (one version per step, as in a trajectory slot) or a scalar. `final_obs`
        holds the true last observation of every truncated step, one row per True in `truncated`, in
        `np.nonzero(truncated)` order (time-major).
        """
        t_len, b = rewards.shape
        if t_len != self.segment_len:
            raise ValueError(f"chunk has T={t_len} steps, the buffer was built for segment_len={self.segment_len}")
        if obs.shape[:2] != (t_len + 1, b):
            raise ValueError(f"obs has shape {obs.shape}, expected [{t_len + 1}, {b}, ...]")
        if b > self.segments:
            raise ValueError(f"chunk of {b} columns exceeds the buffer's {self.segments} segments")
        c = self.counters
        seg = (int(c[_NEXT_SEGMENT]) + np.arange(b)) % self.segments
        self.obs[seg] = np.swapaxes(obs, 0, 1)
        self.actions[seg] = np.swapaxes(actions, 0, 1)
        self.rewards[seg] = rewards.T
        self.terminated[seg] = terminated.T
        self.truncated[seg] = truncated.T
        v = np.asarray(versions)
        self.versions[seg] = v.T if v.ndim == 2 else (v[None, :] if v.ndim == 1 else v)
        steps = np.arange(t_len)
        self.insert_index[seg] = int(c[_INSERTED]) + steps[None, :] * b + np.arange(b)[:, None]
        self.sampleable[seg] = True
        self.final_slot[seg] = -1
        evicted = self._store_final_obs(seg, truncated, final_obs)
        self.next_segment[seg] = -1
        self._link(seg, obs[0], obs[-1], terminated[-1] | truncated[-1])
        c[_INSERTED] += t_len * b
        c[_NEXT_SEGMENT] = (int(c[_NEXT_SEGMENT]) + b) % self.segments
        c[_FILLED_SEGMENTS] = min(int(c[_FILLED_SEGMENTS]) + b, self.segments)
        indices = (seg[:, None] * t_len + steps[None, :]).ravel()
        return InsertResult(indices=indices, evicted=evicted)

    def _link(self, seg: np.ndarray, first_obs: np.ndarray, last_obs: np.ndarray, ended: np.ndarray) -> None:
        """Link each new column to the unique open tail whose last observation equals its first observation.

        Candidates are found by a hash of the observation's bytes (one dict lookup per column, not a comparison
        with every open tail) and confirmed by an exact comparison; any ambiguity leaves the column unlinked.
        """
        # a tail overwritten since (by this chunk too: its insert_index is already new) is gone
        tails = [tail for tail in self._open_tails if self.insert_index[tail[0], 0] == tail[1]]
        first = np.ascontiguousarray(first_obs).reshape(len(seg), -1)
        if tails:
            by_key: dict[int, list[int]] = {}
            for i, tail in enumerate(tails):
                by_key.setdefault(tail[2], []).append(i)
            keys = [hash(row.tobytes()) for row in first]
            counts = Counter(keys)
            linked: set[int] = set()
            for j, key in enumerate(keys):
                candidates = by_key.get(key, ())
                if counts[key] != 1 or not candidates:
                    continue  # no tail, or several new columns start from the same observation
                equal = [i for i in candidates
                         if np.array_equal(self.obs[tails[i][0], self.segment_len].reshape(-1), first[j])]
                if len(equal) == 1:
                    self.next_segment[tails[equal[0]][0]] = seg[j]
                    linked.add(equal[0])
            tails = [tail for i, tail in enumerate(tails) if i not in linked]
        last = np.ascontiguousarray(last_obs).reshape(len(seg), -1)
        tails += [(int(s), int(self.insert_index[s, 0]), hash(row.tobytes()))
                  for s, row, end in zip(seg, last, ended) if not end]
        self._open_tails = tails[-MAX_OPEN_TAILS:]

    def _store_final_obs(self, seg: np.ndarray, truncated: np.ndarray, final_obs: np.ndarray | None) -> np.ndarray:
        t_idx, b_idx = np.nonzero(truncated)
        n = len(t_idx)
        if n == 0:
            return np.empty(0, np.int64)
        if final_obs is None or len(final_obs) != n:
            got = "none" if final_obs is None else len(final_obs)
            raise ValueError(f"{n} truncated steps need {n} final observations, got {got}")
        side = len(self.final_owner)
        if n > side:
            raise ValueError(f"{n} truncated steps in one chunk exceed final_obs_capacity={side}")
        rows = (int(self.counters[_SIDE_NEXT]) + np.arange(n)) % side
        owners = self.final_owner[rows]
        owned = owners >= 0
        owners, owned_rows = owners[owned], rows[owned]
        # still live: its transition still points here (an overwritten segment was reset to -1 above)
        live = owners[self.final_slot.flat[owners] == owned_rows]
        self.sampleable.flat[live] = False
        self.final_slot.flat[live] = -1
        flat = seg[b_idx] * self.segment_len + t_idx
        self.final_obs[rows] = final_obs
        self.final_owner[rows] = flat
        self.final_slot.flat[flat] = rows
        self.counters[_SIDE_NEXT] = (int(self.counters[_SIDE_NEXT]) + n) % side
        self.counters[_EVICTED] += len(live)
        return live

    # --- sampling -------------------------------------------------------------------------------------------
    def sample_indices(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n flat indices drawn uniformly from the sampleable transitions."""
        size = self.size
        if size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = rng.integers(0, size, n)
        for _ in range(100):  # redraw the (rare) transitions whose final observation was evicted
            bad = ~self.sampleable.flat[idx]
            if not bad.any():
                return idx
            idx[bad] = rng.integers(0, size, int(bad.sum()))
        raise ValueError("replay buffer holds (almost) no sampleable transitions")

    def recent_indices(self, count: int) -> np.ndarray:
        """Flat indices of the sampleable transitions among the newest `count` inserted."""
        size = self.size
        held = self.insert_index.reshape(-1)[:size]
        return np.flatnonzero((held >= self.inserted - count) & self.sampleable.reshape(-1)[:size])

    def gather(self, indices: np.ndarray) -> ReplayBatch:
        """The transitions at flat `indices`, with next observations (final ones for truncated steps)."""
        s, t = np.divmod(indices, self.segment_len)
        next_obs = self.obs[s, t + 1]
        slots = self.final_slot[s, t]
        has_final = slots >= 0
        if has_final.any():
            next_obs[has_final] = self.final_obs[slots[has_final]]
        return ReplayBatch(obs=self.obs[s, t], actions=self.actions[s, t], rewards=self.rewards[s, t],
                           next_obs=next_obs, terminated=self.terminated[s, t], truncated=self.truncated[s, t],
                           versions=self.versions[s, t], insert_index=self.insert_index[s, t], indices=indices)

    def sample(self, n: int, rng: np.random.Generator) -> ReplayBatch:
        return self.gather(self.sample_indices(n, rng))

    def age(self, batch: ReplayBatch) -> np.ndarray:
        """Transitions inserted since each sampled one (0 = the newest)."""
        return self.inserted - 1 - batch.insert_index
