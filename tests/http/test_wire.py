"""sr.http.wire: the answer heads sr writes."""

from __future__ import annotations

import email.utils
import re
import time

import pytest

from sr.http.wire import InvalidAnswer, answer_head

JSON = (b"content-type", b"application/json")
DATE = re.compile(rb"date: ([^\r]*)\r\n")


def without_date(head: bytes) -> bytes:
    """The head with its one Date line removed, after checking that line."""
    (value,) = DATE.findall(head)
    sent = email.utils.parsedate_to_datetime(value.decode()).timestamp()
    assert abs(sent - time.time()) < 2 and value.endswith(b" GMT")
    return DATE.sub(b"", head)


def test_head_declares_the_length_and_ends_in_a_blank_line():
    head = answer_head(200, [JSON, (b"X-Sr-Replica", b"r-1")], 17, close=False)
    assert without_date(head) == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Sr-Replica: r-1\r\n"
        b"content-length: 17\r\n\r\n"
    )


def test_close_is_declared_and_an_unknown_status_has_an_empty_reason():
    assert without_date(answer_head(599, [], 0, close=True)) == (
        b"HTTP/1.1 599 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )


def test_framing_and_date_headers_are_the_servers_alone():
    given = [
        (b"Content-Length", b"999"),
        (b"transfer-encoding", b"chunked"),
        (b"Connection", b"x"),
        (b"Date", b"yesterday"),
    ]
    assert (
        without_date(answer_head(200, given, 0, close=False))
        == b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    )


def test_an_answer_without_a_length_declares_none():
    assert without_date(answer_head(204, [], None, close=False)) == (
        b"HTTP/1.1 204 No Content\r\n\r\n"
    )


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-a", b"one\r\nset-cookie: evil")],  # header injection
        [(b"x-a", b"one\nx-b: two")],
        [(b"x-a", b"nul\0")],
        [(b"bad name", b"v")],
        [(b"", b"v")],
        [(b"x-a\r\n", b"v")],
        [("x-a", "text, not bytes")],
        [(b"x-a",)],
    ],
)
def test_headers_that_cannot_be_written_are_refused(headers):
    with pytest.raises(InvalidAnswer):
        answer_head(200, headers, 0, close=False)


@pytest.mark.parametrize("status", [99, 1000, -1, "200", None])
def test_status_must_be_three_digits(status):
    with pytest.raises(InvalidAnswer):
        answer_head(status, [], 0, close=False)
