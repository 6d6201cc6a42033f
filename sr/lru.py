"""The one LRU cache of sr: a bounded mapping that forgets the least recently used entry.

Used by the router's result cache (sr.router.cache: answer bodies per deployment) and the
worker's engine (sr.worker.engine: rows by token ids). Rules:
- `get` of a present key makes it the most recent; `put` stores it as the most recent and
  then drops the least recent entries beyond `capacity`.
- `capacity` 0 keeps nothing (every `put` is a no-op); a negative capacity is a bug.
- `hits` and `misses` count `get`s, for metrics and cards.

Pure: no I/O, no clock, no locks (each user calls it from one thread: a Trio loop).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: K, value: V) -> None:
        if self.capacity == 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
