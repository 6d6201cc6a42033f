"""Fault injection for chaos tests (SR_FAULT_INJECTION=1 at worker start, else 404).

Modes act on the forward routes only, so `/health` keeps answering while a forward "hangs":
- hang: forward requests wait until the mode changes (or their caller gives up);
- slow: each forward request first sleeps `slow_ms`;
- fail: forward requests answer 500 worker_failed;
- exit: the process exits abruptly (os._exit(1)) right after answering the admin request.
"""

from __future__ import annotations

from typing import Any

import trio

from sr.errors import InvalidRequest
from sr.worker import validation as v

MODES = ("none", "hang", "slow", "fail", "exit")
MAX_SLOW_MS = 600_000


def fault_of(obj: dict[str, Any]) -> tuple[str, int]:
    """(mode, slow_ms) of a fault body read as an object, or InvalidRequest naming the field.

    The one check of a fault: the worker's `/admin/faults` and the router's
    `/api/v1/faults` (sr.router.faults, which adds the replica it goes to) both use it."""
    mode = obj.get("mode")
    if mode not in MODES:
        raise InvalidRequest(f"mode: expected one of {', '.join(MODES)}")
    slow_ms = obj.get("slow_ms", 0)
    if isinstance(slow_ms, bool) or not isinstance(slow_ms, int) or not 0 <= slow_ms <= MAX_SLOW_MS:
        raise InvalidRequest(f"slow_ms: expected an integer from 0 to {MAX_SLOW_MS}")
    return mode, slow_ms


class FaultState:
    def __init__(self) -> None:
        self.mode = "none"
        self.slow_ms = 0
        self._released = trio.Event()
        self._released.set()

    def card(self) -> dict[str, Any]:
        return {"mode": self.mode, "slow_ms": self.slow_ms}

    def configure(self, body: bytes) -> dict[str, Any]:
        obj = v.parse_object(body)
        v.check_fields(obj, allowed=frozenset({"mode", "slow_ms"}), required=("mode",))
        mode, slow_ms = fault_of(obj)
        if mode == "hang" and self._released.is_set():
            self._released = trio.Event()
        elif mode != "hang":
            self._released.set()
        self.mode, self.slow_ms = mode, slow_ms
        return self.card()

    async def before_forward(self) -> bool:
        """Apply the mode to one forward request; False means "answer worker_failed"."""
        if self.mode == "hang":
            await self._released.wait()
        if self.mode == "slow" and self.slow_ms:
            await trio.sleep(self.slow_ms / 1000)
        return self.mode != "fail"
