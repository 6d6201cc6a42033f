"""sr.http.connection: the rules of its module docstring, one test each, without sockets."""

from __future__ import annotations

import pytest

from sr.errors import InvalidRequest
from sr.http.connection import (
    CLOSED,
    END,
    NEED_DATA,
    PAUSED,
    ConnectionStateError,
    ServerConnection,
    State,
)
from sr.http.parse import RequestHead

GET = b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n"
POST = b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"


def events(connection: ServerConnection) -> list:
    out = []
    while (event := connection.next_event()) not in (NEED_DATA, PAUSED, CLOSED):
        out.append(event)
    out.append(event)
    return out


def test_pipelined_requests_wait_for_their_turn():
    connection = ServerConnection(16384)
    connection.receive_data(GET + POST)
    first = events(connection)
    assert isinstance(first[0], RequestHead) and first[1:] == [END, PAUSED]
    assert connection.next_event() is PAUSED  # the POST stays in the parser
    with pytest.raises(ConnectionStateError):
        connection.start_next_cycle()  # not answered yet
    connection.answer(200, [], b"ok")
    assert connection.keep_alive
    connection.start_next_cycle()
    second = events(connection)
    assert second[0].method == b"POST" and second[1:] == [b"abc", END, PAUSED]


def test_an_answer_before_the_body_is_read_closes_the_connection():
    connection = ServerConnection(16384)
    connection.receive_data(POST[:-2])
    assert isinstance(connection.next_event(), RequestHead)
    data = connection.answer(413, [], b"no")
    assert b"connection: close\r\n" in data
    assert connection.server is State.MUST_CLOSE and not connection.keep_alive
    with pytest.raises(ConnectionStateError):
        connection.answer(200, [], b"twice")


def test_connection_close_and_shutdown_end_the_connection_after_the_answer():
    for request, close in ((GET.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"), False),
                           (GET, True)):  # fmt: skip
        connection = ServerConnection(16384)
        connection.receive_data(request)
        events(connection)
        assert b"connection: close" in connection.answer(200, [], b"", close=close)
        assert not connection.keep_alive


def test_an_unparsable_request_is_refused_once_then_closed():
    connection = ServerConnection(16384)
    connection.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n")
    with pytest.raises(InvalidRequest):
        connection.next_event()
    assert connection.caller is State.ERROR
    assert connection.refusal(400, [], b"bad").startswith(b"HTTP/1.1 400 ")
    assert connection.server is State.MUST_CLOSE
    with pytest.raises(ConnectionStateError):
        connection.refusal(400, [], b"bad")


def test_continue_is_offered_once_and_only_while_the_body_is_held_back():
    head = b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    connection = ServerConnection(16384)
    connection.receive_data(head)
    assert isinstance(connection.next_event(), RequestHead)
    assert connection.continue_bytes() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert connection.continue_bytes() is None
    eager = ServerConnection(16384)
    eager.receive_data(head + b"{}")
    assert isinstance(eager.next_event(), RequestHead)
    assert eager.continue_bytes() is None  # the body came anyway


def test_end_of_stream_follows_what_came_before_it():
    connection = ServerConnection(16384)
    connection.receive_data(GET)
    connection.receive_data(b"")
    assert connection.caller_closed
    assert events(connection)[1:] == [END, PAUSED]
    connection.answer(204, [], b"")
    connection.start_next_cycle()
    assert connection.next_event() is CLOSED and connection.caller is State.CLOSED


def test_head_answers_declare_the_length_and_carry_no_body():
    connection = ServerConnection(16384)
    connection.receive_data(GET.replace(b"GET", b"HEAD"))
    events(connection)
    data = connection.answer(200, [], b"", length=7)
    assert b"content-length: 7\r\n" in data and data.endswith(b"\r\n\r\n")


def test_a_body_parsed_whole_is_taken_at_once_and_a_partial_one_is_left():
    whole = ServerConnection(16384)
    whole.receive_data(POST)
    assert isinstance(whole.next_event(), RequestHead)
    assert whole.take_complete_body() == b"abc" and whole.request_complete
    partial = ServerConnection(16384)
    partial.receive_data(POST[:-1])
    assert isinstance(partial.next_event(), RequestHead)
    assert partial.take_complete_body() is None  # "ab" is here, "c" is not: nothing taken
    assert partial.next_event() == b"ab" and not partial.request_complete
