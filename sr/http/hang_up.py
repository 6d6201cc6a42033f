"""Noticing callers that hang up while their request is dispatched: one poller per server.

The router cancels a dispatch whose caller went away, so that an abandoned request frees
its worker slot. A watcher task per request did that by waiting on the caller's socket: a
task start, an epoll registration and removal and a cancellation per request, 15-22 % of
the router's CPU at concurrency 1 (docs/benchmarks-history.md). Instead, while any request is
watched, this one task asks poll(2) every `interval_s` which of the watched sockets saw
the caller close (POLLRDHUP) or reset (POLLHUP, POLLERR). A request pays a dict entry;
a hang-up is noticed up to `interval_s` later. Bytes from the caller (a pipelined request)
are not a hang-up and are left unread.

ASGI apps reach it through the `sr.http.hang_up` scope extension (sr.http.asgi_adapter): `scope
["extensions"]["sr.hang_up"]["watch"](cancel_scope)` cancels `cancel_scope` when the caller
hangs up and returns the function that stops watching.
"""

from __future__ import annotations

import select
from collections.abc import Callable, Hashable

import trio

EXTENSION = "sr.hang_up"
DEFAULT_INTERVAL_S = 0.05
# POLLHUP and POLLERR are always reported; a peer's orderly close (FIN) must be asked for.
_HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL | select.POLLRDHUP


class HangUpPoller:
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._watched: dict[Hashable, tuple[int, Callable[[], None]]] = {}
        self._wake = trio.Event()

    def watch(self, key: Hashable, fd: int, on_hang_up: Callable[[], None]) -> None:
        """Call `on_hang_up()` (once) if the peer of socket `fd` hangs up before
        `unwatch(key)`."""
        self._watched[key] = (fd, on_hang_up)
        self._wake.set()

    def unwatch(self, key: Hashable) -> None:
        self._watched.pop(key, None)

    def watching(self) -> int:
        return len(self._watched)

    async def run(self) -> None:
        """Poll while anything is watched; sleep on an event while nothing is."""
        while True:
            if not self._watched:
                self._wake = trio.Event()
                await self._wake.wait()
            await trio.sleep(self.interval_s)
            self.poll_once()

    def poll_once(self) -> None:
        """One non-blocking poll(2) over the watched sockets; runs the callbacks of those
        whose caller hung up."""
        if not self._watched:
            return
        poller = select.poll()
        keys: dict[int, Hashable] = {}
        for key, (fd, _) in self._watched.items():
            poller.register(fd, select.POLLRDHUP)
            keys[fd] = key
        for fd, events in poller.poll(0):
            if events & _HUNG_UP:
                _, on_hang_up = self._watched.pop(keys[fd])
                on_hang_up()
