"""The caller-hang-up watch through the server's `sr.hang_up` extension (sr.http.hang_up)."""

from __future__ import annotations

import trio

from sr.errors import Overloaded
from sr.http.hang_up import EXTENSION

from .asgi_client import call
from .test_app import CANCELED_LINE, build, raising, stalling

EMBED = {"model": "primary", "input": "a"}


class FakeServerWatch:
    """What sr's server offers in `scope["extensions"]["sr.hang_up"]`, with the hang-up
    under the test's control."""

    def __init__(self) -> None:
        self.scopes: list[trio.CancelScope] = []
        self.watching: set[int] = set()

    def extensions(self) -> dict:
        return {EXTENSION: {"watch": self.watch}}

    def watch(self, scope: trio.CancelScope):
        self.scopes.append(scope)
        key = len(self.scopes)
        self.watching.add(key)
        return lambda: self.watching.discard(key)

    def hang_up(self) -> None:
        self.scopes[-1].cancel()


async def test_each_dispatch_is_watched_and_unwatched_with_no_task_of_its_own():
    app, core = build()
    server = FakeServerWatch()
    with trio.fail_after(5):
        for _ in range(3):
            answer = await call(
                app, "POST", "/v1/embeddings", EMBED, extensions=server.extensions()
            )
            assert answer.status == 200 and answer.json()["model"] == "primary"
    assert len(server.scopes) == 3 and server.watching == set()
    assert len(core.calls) == 3
    assert 'outcome="ok",route="/v1/embeddings"} 3.0' in app.metrics.render().decode()


async def test_a_hang_up_cancels_the_dispatch_and_counts_canceled():
    handler, started, cancelled = stalling()
    app, _ = build(handler=handler)
    server = FakeServerWatch()
    result = []

    async def request():
        answer = await call(app, "POST", "/v1/embeddings", EMBED, extensions=server.extensions())
        result.append(answer)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request)
            await started.wait()
            server.hang_up()
    assert result == [None]  # nothing sent to a caller who left
    assert cancelled == [True] and server.watching == set()
    assert CANCELED_LINE in app.metrics.render().decode()


async def test_pool_errors_still_become_wire_errors_and_stop_the_watch():
    app, _ = build(handler=raising(Overloaded("all replicas are full")))
    server = FakeServerWatch()
    with trio.fail_after(5):
        answer = await call(app, "POST", "/v1/embeddings", EMBED, extensions=server.extensions())
    assert answer.status == 503
    assert answer.json()["error"]["code"] == "overloaded"
    assert server.watching == set()
    assert 'outcome="overloaded"' in app.metrics.render().decode()
