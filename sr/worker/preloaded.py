"""A model loaded before this process was forked, for the worker to serve instead of loading.

A deployment's fork server (sr.worker.model_server) loads and packs the model once and
offers it here; the replicas it forks claim it at load (sr.worker.service), so its pages
stay shared between them. A worker claims it only when the options it loads with match
those it was loaded for (artifact, revision, device, dtype served, kernel, engine); otherwise, and
in any process nothing was offered in, it loads as usual.
"""

from __future__ import annotations

from typing import Any

LOAD_FIELDS = ("artifact", "revision", "device", "dtype", "kernel", "engine")

_offered: tuple[tuple, Any] | None = None


def load_key(options) -> tuple:
    """What decides which model a worker loads (WorkerOptions, dtype already resolved)."""
    return tuple(getattr(options, field) for field in LOAD_FIELDS)


def offer(options, model) -> None:
    global _offered
    _offered = (load_key(options), model)


def claim(options):
    """The offered model when it was loaded for `options`, else None."""
    if _offered is not None and _offered[0] == load_key(options):
        return _offered[1]
    return None
