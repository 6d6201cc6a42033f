"""Reloading the config file into a running router (SIGHUP or POST /api/v1/reload).

The file is read and validated first; an invalid file never reaches the pool. The pool
prepares the new replicas before publishing them and keeps the old config serving when that
fails. Only after the pool accepted the new config does the front end adopt
it (artifacts, API keys, cache eligibility). One reload at a time, by the pool's one reload
lock (`Supervisor.reloading`, whoever started the running one: this file reloader or the
Python API): a reload asked for here while one runs is refused rather than queued, so
callers learn the outcome they caused. The pool's `reload` returns to us with no checkpoint
before `adopt`, so no other reload can slip between the pool taking a config and the front
end adopting it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import attrs

from sr.config.schema import SrConfig
from sr.errors import (
    ConfigError,
    InvalidConfig,
    ReloadInProgress,
    ReloadRejected,
    SrError,
    UsageError,
)
from sr.events import EventSink
from sr.settings import ModelSources

_log = logging.getLogger("sr.events")


def reload_summary(config: SrConfig) -> dict[str, Any]:
    return {
        "status": "reloaded",
        "deployments": {
            name: {"artifact": d.artifact, "replicas": len(d.placements())}
            for name, d in config.deployments.items()
        },
    }


@attrs.define
class ConfigReloader:
    core: Any
    config_path: str | os.PathLike
    current: SrConfig = attrs.field(kw_only=True)
    _adopt: Callable[[SrConfig], None] = attrs.field(kw_only=True)
    _events: EventSink = attrs.field(kw_only=True)
    # where artifacts resolve, for the folders' input limits
    _sources: ModelSources | None = attrs.field(default=None, kw_only=True)

    async def reload(self) -> dict[str, Any]:
        """Re-read the file and apply it; InvalidConfig, ReloadFailed or ReloadInProgress."""
        # No checkpoint from this test to the pool taking its lock: nothing slips between.
        if self.core.reloading:
            raise ReloadInProgress("a reload is already in progress")
        from sr.config.load import load_config
        from sr.models.limits import settle_input_limits

        try:
            new = load_config(self.config_path)
            # As `sr serve` settled the file it started from, so unchanged deployments keep
            # their replicas whether the file states the folder's limit or leaves it out.
            settle_input_limits(new, self._sources)
        except UsageError as error:
            self._events.emit("config_reload_rejected", path=str(self.config_path),
                              error=str(error))  # fmt: skip
            raise InvalidConfig(f"{self.config_path}: {error}") from None
        except ConfigError as error:
            self._events.emit("config_reload_rejected", path=str(self.config_path),
                              error=str(error))  # fmt: skip
            raise InvalidConfig(f"{self.config_path}: {error}") from None
        try:
            await self.core.reload(new)
        except SrError as error:
            self._events.emit("config_reload_failed", error=str(error))
            raise ReloadRejected(
                f"reload failed, the previous config keeps serving: {error}"
            ) from None
        except Exception as error:
            _log.exception("config_reload_failed")
            raise ReloadRejected(
                f"reload failed, the previous config keeps serving: {type(error).__name__}: {error}"
            ) from None
        summary = reload_summary(new)
        if _listener_changed(self.current, new):
            summary["notes"] = ["listener host/port changes take effect at the next start"]
        self.current = new
        self._adopt(new)
        self._events.emit("config_reloaded", deployments=summary["deployments"])
        return summary


def _listener_changed(old: SrConfig, new: SrConfig) -> bool:
    def address(config: SrConfig) -> tuple[str, int] | None:
        return (config.listeners[0].host, config.listeners[0].port) if config.listeners else None

    return address(old) != address(new)
