"""Result cache: keys, 200-only, readiness clears (its size: tests/test_settings.py)."""

from __future__ import annotations

from sr.router.cache import ResultCache, cache_key


def test_key_ignores_key_order_but_not_model_route_or_content():
    """The answer names the model as the request named it, so each name has its entry."""
    a = cache_key("/v1/embeddings", {"model": "primary", "input": ["x", "y"], "k": 1})
    assert a == cache_key("/v1/embeddings", {"k": 1, "input": ["x", "y"], "model": "primary"})
    assert a != cache_key("/v1/embeddings", {"k": 1, "input": ["x", "y"], "model": "/abs/path"})
    assert a != cache_key("/v1/classify", {"input": ["x", "y"], "k": 1})
    assert a != cache_key("/v1/embeddings", {"input": ["y", "x"], "k": 1})


def test_only_single_worker_deployments_cache_and_only_200s():
    cache = ResultCache(8)
    cache.configure({"solo": 1, "pair": 2})
    assert cache.enabled_for("solo")
    assert not cache.enabled_for("pair")
    assert not cache.put("pair", "k", 200, b"x")
    assert not cache.put("solo", "k", 503, b"x")
    assert cache.get("solo", "k") is None
    assert cache.put("solo", "k", 200, b"answer")
    assert cache.get("solo", "k") == b"answer"
    assert (cache.hits, cache.misses) == (1, 1)


def test_readiness_change_clears_only_that_deployment():
    cache = ResultCache(8)
    cache.configure({"a": 1, "b": 1})
    cache.put("a", "k", 200, b"1")
    cache.put("b", "k", 200, b"2")
    cache.on_event("replica_ejected", {"deployment": "a"})  # not a readiness event
    assert cache.entries("a") == 1
    cache.on_event("replica_state", {"deployment": "a", "replica": "a-0", "state": "restarting"})
    assert cache.entries("a") == 0
    assert cache.get("b", "k") == b"2"


def test_reconfigure_drops_entries_and_follows_replica_counts():
    cache = ResultCache(8)
    cache.configure({"a": 1})
    cache.put("a", "k", 200, b"1")
    cache.configure({"a": 2})
    assert not cache.enabled_for("a")
    cache.configure({"a": 1})
    assert cache.get("a", "k") is None


def test_cache_off_with_zero():
    cache = ResultCache(0)
    cache.configure({"a": 1})
    assert not cache.enabled_for("a")
