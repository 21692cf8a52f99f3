"""Dict observations as several arrays indexed together (no torch).

A Dict observation is stored as one array per key, all with the same leading dimensions (slot, step, env).
`ArrayDict` lets the code that moves observations around (env backends, the rollout worker, the evaluator)
index, slice and assign them as if they were one array: `obs[slot, t + 1]` is an `ArrayDict` of views, and
`obs[i] = {"screen": frame, "measurements": vec}` writes each key. A plain Box observation stays a plain
`np.ndarray` everywhere; nothing here is on its path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from asyncrl.envs.base import EnvSpec

Obs = np.ndarray  # a Box observation (batch); a Dict observation is an ArrayDict


class ArrayDict:
    """Arrays keyed by observation key, with the same leading dimensions; `x["key"]` is one key's array, any
    other index applies to every key (`x[slot, t]`, `x[mask]`) and gives an `ArrayDict` of the results."""

    __slots__ = ("arrays",)

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = dict(arrays)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            return self.arrays[index]
        return ArrayDict({k: a[index] for k, a in self.arrays.items()})

    def __setitem__(self, index: Any, value: ArrayDict | Mapping[str, Any]) -> None:
        for k, a in self.arrays.items():
            a[index] = value[k]

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def keys(self):
        return self.arrays.keys()

    def items(self):
        return self.arrays.items()

    def zeros_like(self) -> ArrayDict:
        return ArrayDict({k: np.zeros_like(a) for k, a in self.arrays.items()})


def zeros_like(obs: np.ndarray | ArrayDict) -> np.ndarray | ArrayDict:
    return obs.zeros_like() if isinstance(obs, ArrayDict) else np.zeros_like(obs)


def obs_zeros(spec: EnvSpec, n: int) -> np.ndarray | ArrayDict:
    """Observations of `n` envs, as the backend writes them (images channels first)."""
    if spec.is_dict:
        return ArrayDict({k.key: np.zeros((n, *k.shape), dtype=k.dtype) for k in spec.obs_keys})
    return np.zeros((n, *spec.obs_shape), dtype=spec.obs_dtype)


def first_image(obs: np.ndarray | ArrayDict) -> np.ndarray:
    """What to show of one observation: a Box observation itself, or a Dict's first image key (else its first)."""
    if not isinstance(obs, ArrayDict):
        return obs
    arrays = list(obs.arrays.values())
    return next((a for a in arrays if a.ndim == 3), arrays[0])
