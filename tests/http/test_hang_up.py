"""sr.http.hang_up: one poller notices callers hanging up, for every watched socket."""

from __future__ import annotations

import socket
import struct

import trio

from sr.http.hang_up import HangUpPoller


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_a_closed_peer_is_reported_once_and_unwatched():
    ours, theirs = _pair()
    poller, hung = HangUpPoller(), []
    poller.watch("a", ours.fileno(), lambda: hung.append("a"))
    poller.poll_once()
    assert hung == []
    theirs.close()
    poller.poll_once()
    poller.poll_once()
    assert hung == ["a"] and poller.watching() == 0
    ours.close()


def test_bytes_from_the_caller_are_not_a_hang_up_and_stay_unread():
    ours, theirs = _pair()
    poller, hung = HangUpPoller(), []
    poller.watch("a", ours.fileno(), lambda: hung.append("a"))
    theirs.sendall(b"GET /next HTTP/1.1\r\n\r\n")  # a pipelined request
    poller.poll_once()
    assert hung == [] and poller.watching() == 1
    assert ours.recv(100, socket.MSG_PEEK).startswith(b"GET /next")
    theirs.close()
    poller.poll_once()  # a close after pipelined bytes is still seen
    assert hung == ["a"]
    ours.close()


def test_unwatched_sockets_are_not_reported():
    ours, theirs = _pair()
    poller, hung = HangUpPoller(), []
    poller.watch("a", ours.fileno(), lambda: hung.append("a"))
    poller.unwatch("a")
    poller.unwatch("a")  # twice is fine
    theirs.close()
    poller.poll_once()
    assert hung == []
    ours.close()


def test_a_tcp_reset_is_a_hang_up():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        caller = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    caller.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    caller.close()  # RST, not FIN
    poller, hung = HangUpPoller(), []
    poller.watch("a", ours.fileno(), lambda: hung.append("a"))
    poller.poll_once()
    assert hung == ["a"]
    ours.close()


async def test_the_poller_task_polls_only_while_something_is_watched():
    ours, theirs = _pair()
    poller, hung = HangUpPoller(interval_s=0.01), []
    polls = []
    real_poll = poller.poll_once
    poller.poll_once = lambda: (polls.append(1), real_poll())
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            await trio.sleep(0.1)
            assert polls == []  # nothing watched: asleep
            poller.watch("a", ours.fileno(), lambda: hung.append("a"))
            theirs.close()
            while not hung:
                await trio.sleep(0.01)
            settled = len(polls)
            await trio.sleep(0.1)
            assert len(polls) <= settled + 1  # back to sleep once nothing is watched
            nursery.cancel_scope.cancel()
    ours.close()
