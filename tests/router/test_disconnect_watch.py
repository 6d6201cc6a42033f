"""The caller-hang-up watch when the app's lifespan runs (watchers in its nursery)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from sr.errors import Overloaded

from .asgi_client import call
from .test_app import CANCELED_LINE, build, hang_up_mid_request, raising, stalling


@asynccontextmanager
async def lifespan(app):
    """Run the app's lifespan (startup, then shutdown on exit) like an ASGI server."""
    to_app_send, to_app = trio.open_memory_channel(4)
    sent: list[str] = []

    async def send(message):
        sent.append(message["type"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, {"type": "lifespan"}, to_app.receive, send)
        await to_app_send.send({"type": "lifespan.startup"})
        while "lifespan.startup.complete" not in sent:
            await trio.sleep(0)
        assert app._watch_nursery is not None
        yield app._watch_nursery
        await to_app_send.send({"type": "lifespan.shutdown"})
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert app._watch_nursery is None


async def test_answer_through_lifespan_nursery_leaves_no_watcher_behind():
    app, core = build()
    with trio.fail_after(5):
        async with lifespan(app) as nursery:
            for _ in range(3):
                answer = await call(
                    app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"}
                )
                assert answer.status == 200
                assert answer.json()["model"] == "primary"
            await trio.sleep(0.01)  # let the cancelled watchers finish
            assert nursery.child_tasks == frozenset()
    assert len(core.calls) == 3
    metrics = app.metrics.render().decode()
    assert 'outcome="ok",route="/v1/embeddings"} 3.0' in metrics


async def test_hang_up_cancels_the_dispatch_and_counts_canceled():
    handler, started, cancelled = stalling()
    app, _ = build(handler=handler)
    with trio.fail_after(5):
        async with lifespan(app):
            result = await hang_up_mid_request(app, started)
    assert result == [None]
    assert cancelled == [True]
    assert CANCELED_LINE in app.metrics.render().decode()


async def test_pool_errors_still_become_wire_errors():
    app, _ = build(handler=raising(Overloaded("all replicas are full")))
    with trio.fail_after(5):
        async with lifespan(app):
            answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"})
    assert answer.status == 503
    assert answer.json()["error"]["code"] == "overloaded"
    assert 'outcome="overloaded"' in app.metrics.render().decode()


async def test_a_failing_receive_does_not_break_the_lifespan_or_the_request():
    app, _ = build()

    async def broken_receive_after_body():
        raise RuntimeError("server bug")

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}
    messages = [{"type": "http.request", "body": b'{"model":"primary","input":"a"}'}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        return await broken_receive_after_body()

    async def send(message):
        sent.append(message)

    with trio.fail_after(5):
        async with lifespan(app):
            await app(scope, receive, send)
            await trio.sleep(0.01)
    assert sent[0]["status"] == 200
