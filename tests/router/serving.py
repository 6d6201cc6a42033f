"""One sr.http.server on a free loopback port, for tests that talk to it over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from sr.http.server import H1Server, open_listeners


@asynccontextmanager
async def serving(server: H1Server) -> AsyncIterator[tuple[int, trio.Event]]:
    """Serve on 127.0.0.1:<free port>; yields (port, stop); stops gracefully on exit."""
    listeners, _ = await open_listeners(host="127.0.0.1", port=0)
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: server.serve(
            listeners, shutdown_trigger=stop.wait, task_status=task_status))  # fmt: skip
        yield port, stop
        stop.set()
