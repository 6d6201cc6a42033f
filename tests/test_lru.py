"""The one LRU cache (sr.lru): order, capacity, hit and miss counts."""

from __future__ import annotations

import pytest

from sr.lru import LruCache


def test_lru_evicts_least_recently_used():
    lru = LruCache(2)
    lru.put("a", b"1")
    lru.put("b", b"2")
    assert lru.get("a") == b"1"  # a is now the most recent
    lru.put("c", b"3")
    assert lru.get("b") is None
    assert lru.get("a") == b"1"
    assert lru.get("c") == b"3"
    assert len(lru) == 2


def test_zero_entries_keeps_nothing():
    lru = LruCache(0)
    lru.put("a", b"1")
    assert lru.get("a") is None


def test_hits_and_misses_are_counted():
    lru: LruCache[str, bytes] = LruCache(1)
    lru.put("a", b"1")
    assert lru.get("a") == b"1"
    assert lru.get("b") is None
    assert (lru.hits, lru.misses) == (1, 1)
    lru.clear()
    assert len(lru) == 0 and lru.get("a") is None


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        LruCache(-1)
