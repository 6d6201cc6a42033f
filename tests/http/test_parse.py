"""sr.http.parse: llhttp's events in order, and the rules sr adds on top."""

from __future__ import annotations

import pytest

from sr.errors import InvalidRequest
from sr.http.parse import CLOSED, END, NEED_DATA, HeadersTooLarge, RequestHead, RequestParser

POST = b"POST /v1/x?a=1 HTTP/1.1\r\nHost: w\r\nX-Pad:  v \t\r\nContent-Length: 5\r\n\r\nhello"


def events(parser: RequestParser) -> list:
    out = []
    while (event := parser.next_event()) not in (NEED_DATA, CLOSED):
        out.append(event)
    return out


def parsed(*pieces: bytes, max_header_bytes: int = 16384) -> list:
    parser = RequestParser(max_header_bytes)
    out = []
    for piece in pieces:
        parser.feed(piece)
        out += events(parser)
    return out


def test_a_request_becomes_head_body_end():
    head, body, end = parsed(POST)
    assert isinstance(head, RequestHead)
    assert (head.method, head.target, head.http_version) == (b"POST", b"/v1/x?a=1", b"1.1")
    assert head.headers == [(b"host", b"w"), (b"x-pad", b"v"), (b"content-length", b"5")]
    assert head.keep_alive and not head.expects_continue
    assert (body, end) == (b"hello", END)


def test_byte_by_byte_gives_the_same_request():
    got = parsed(*(POST[i : i + 1] for i in range(len(POST))))
    assert got[0] == parsed(POST)[0]
    assert b"".join(got[1:-1]) == b"hello" and got[-1] is END


def test_pipelined_requests_come_out_in_order_and_nothing_is_lost():
    get = b"GET /next HTTP/1.1\r\nHost: w\r\n\r\n"
    got = parsed(POST + get + POST)
    assert [type(e).__name__ if isinstance(e, RequestHead) else e for e in got] == [
        "RequestHead", b"hello", END, "RequestHead", END, "RequestHead", b"hello", END
    ]  # fmt: skip
    assert got[3].target == b"/next"


def test_a_chunked_body_is_reassembled():
    chunked = b"POST / HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n"
    got = parsed(chunked + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert b"".join(got[1:-1]) == b"abcde" and got[-1] is END


@pytest.mark.parametrize(
    ("head", "keeps"),
    [
        (b"GET / HTTP/1.1\r\nHost: w\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: w\r\nConnection: keep-alive\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: w\r\nConnection: Close\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: w\r\nConnection: keep-alive, close\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: w\r\nConnection: x-close\r\n", True),  # a token, not text
        (b"GET / HTTP/1.0\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n", False),  # h11's rule
    ],
)
def test_keep_alive_follows_h11s_rule(head, keeps):
    assert parsed(head + b"\r\n")[0].keep_alive is keeps


def test_expect_100_continue_is_noted_for_http_1_1_only():
    expect = b"Expect: 100-Continue\r\nContent-Length: 1\r\n\r\n"
    assert parsed(b"POST / HTTP/1.1\r\nHost: w\r\n" + expect)[0].expects_continue
    assert not parsed(b"POST / HTTP/1.0\r\n" + expect)[0].expects_continue


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: w\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\nHost: w\n\n",
        b"GET / HTTP/1.1\r\nHost: w\r\nX: a\x00b\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ],
)
def test_requests_open_to_smuggling_or_misreading_are_refused(head):
    parser = RequestParser(16384)
    parser.feed(head)
    with pytest.raises(InvalidRequest, match="malformed HTTP request"):
        events(parser)
    assert parser.next_event() is CLOSED  # and nothing after it


def test_an_error_comes_after_the_good_requests_before_it():
    parser = RequestParser(16384)
    parser.feed(POST + b"NOT HTTP\r\n\r\n")
    assert len(events_until_error(parser)) == 3
    assert parser.next_event() is CLOSED


def events_until_error(parser: RequestParser) -> list:
    got = []
    with pytest.raises(InvalidRequest):
        while True:
            got.append(parser.next_event())
    return got


@pytest.mark.parametrize("pieces", [1, 16])
def test_a_head_over_the_cap_is_431_whole_or_trickled(pieces):
    head = b"GET / HTTP/1.1\r\nHost: w\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    step = len(head) // pieces + 1
    parser = RequestParser(1024)
    with pytest.raises(HeadersTooLarge):
        for start in range(0, len(head), step):
            parser.feed(head[start : start + step])
            events(parser)


def test_a_large_body_before_a_pipelined_head_does_not_count_as_head():
    big = b"POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 60000\r\n\r\n" + b"x" * 60000
    nxt = b"GET /next HTTP/1.1\r\nHost: w\r\n\r\n"
    got = parsed(big + nxt[:10], nxt[10:], max_header_bytes=1024)  # one read holds both
    assert got[-2].target == b"/next" and got[-1] is END


def test_an_upgrade_is_served_as_a_plain_request_that_closes_the_connection():
    upgrade = b"GET /ws HTTP/1.1\r\nHost: w\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
    parser = RequestParser(16384)
    parser.feed(upgrade + b"\x81\x05hello")
    head, end = events(parser)
    assert head.target == b"/ws" and not head.keep_alive and end is END
    assert parser.next_event() is CLOSED


def test_the_callers_close_stays_closed():
    parser = RequestParser(16384)
    parser.feed(b"GET / HTTP/1.1\r\nHo")
    parser.feed(b"")
    parser.feed(b"st: w\r\n\r\n")  # ignored: the caller had closed
    assert parser.next_event() is CLOSED
    assert parser.next_event() is CLOSED
