"""sr.http.sockio: reads and writes that wait (and checkpoint) only when they must."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sr.http import sockio


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    return trio.SocketStream(left), trio.SocketStream(right)


async def test_round_trip_and_end_of_stream():
    a, b = await _pair()
    await sockio.send_all(a, b"hello")
    assert await sockio.receive_some(b, 100) == b"hello"
    await a.aclose()
    assert await sockio.receive_some(b, 100) == b""


async def test_a_ready_read_does_not_wait_and_an_empty_socket_does():
    a, b = await _pair()
    await sockio.send_all(a, b"x")
    others_ran = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_note_run, others_ran)
        # A cancel point only: no other task is scheduled before the read returns.
        assert await sockio.receive_some_noting_wait(b, 10) == (b"x", False)
        assert others_ran == []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _send_later(a, b"y"))
        with trio.testing.assert_checkpoints():
            assert await sockio.receive_some_noting_wait(b, 10) == (b"y", True)


async def _note_run(ran: list) -> None:
    ran.append(True)


async def test_a_ready_call_in_a_cancelled_scope_is_no_cancel_point():
    # The contract the callers build on (sr.http.server, sr.http.client check themselves):
    # a call that need not wait goes ahead even in a cancelled scope.
    a, b = await _pair()
    with trio.CancelScope() as scope:
        scope.cancel()
        await sockio.send_all(a, b"sent")
        assert await sockio.receive_some(b, 10) == b"sent"
    assert scope.cancelled_caught is False


async def _send_later(stream: trio.SocketStream, data: bytes) -> None:
    await trio.sleep(0.05)
    await sockio.send_all(stream, data)


async def test_a_send_larger_than_the_socket_buffer_waits_for_the_reader():
    a, b = await _pair()
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(payload):
            received.extend(await sockio.receive_some(b, 65536))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await sockio.send_all(a, payload)
    assert bytes(received) == payload


async def test_a_closed_socket_is_a_closed_resource():
    a, _ = await _pair()
    await a.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await sockio.receive_some(a, 10)
    with pytest.raises(trio.ClosedResourceError):
        await sockio.send_all(a, b"x")


async def test_writing_to_a_peer_that_left_is_a_broken_resource():
    a, b = await _pair()
    await b.aclose()
    with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
        for _ in range(100):  # the first writes may still land in the kernel buffer
            await sockio.send_all(a, b"x" * 65536)


async def test_streams_that_are_not_sockets_use_their_own_methods():
    a, b = trio.testing.memory_stream_pair()
    await sockio.send_all(a, b"over memory")
    assert await sockio.receive_some_noting_wait(b, 100) == (b"over memory", True)


async def test_a_send_the_peer_does_not_take_stops_at_the_deadline():
    a, _ = await _pair()
    started = trio.current_time()
    with pytest.raises(sockio.SendTimeout):
        await sockio.send_all(a, b"x" * (16 << 20), timeout_s=0.2)
    assert 0.15 < trio.current_time() - started < 2.0
