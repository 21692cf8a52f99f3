"""The slot queues of a transport that runs its stages in one process (`--serial`): slot indices only, as the
forked engine's free and full queues carry them, and the splits that wait for a free slot (back-pressure)."""

from __future__ import annotations

from collections import deque


class LocalSlots:
    """`count` circulating slots among `splits` env splits."""

    def __init__(self, count: int, splits: int):
        self.free, self.full = deque(range(count)), deque()
        self.splits = splits
        self.waiting: list[int] = []  # splits whose slot is full and that have no free one yet

    def take(self) -> int:
        return self.free.popleft()

    def active(self) -> list[int]:
        """The splits that hold a slot."""
        return [s for s in range(self.splits) if s not in self.waiting]

    def hand_in(self, split: int, slot: int) -> int | None:
        """Queue the split's full slot for the learner; its next slot, or None (it waits for one)."""
        self.full.append(slot)
        if self.free:
            return self.free.popleft()
        self.waiting.append(split)
        return None

    def stalled(self) -> bool:
        """Every split waits: the learner's turn."""
        return len(self.waiting) == self.splits

    def batch(self, size: int) -> list[int] | None:
        """The oldest `size` full slots, or None while fewer are queued."""
        return [self.full.popleft() for _ in range(size)] if len(self.full) >= size else None

    def give_back(self, slots: list[int]) -> list[tuple[int, int]]:
        """Free the slots; the (split, slot) pairs of waiting splits that take one."""
        self.free.extend(slots)
        resumed = []
        while self.waiting and self.free:
            resumed.append((self.waiting.pop(0), self.free.popleft()))
        return resumed
