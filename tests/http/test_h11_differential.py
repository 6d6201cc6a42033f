"""sr.http.connection against h11 on the same valid HTTP/1.1 traffic.

Hypothesis writes a stream of pipelined requests (Content-Length, chunked and bodiless,
header names in any case, values with inner and surrounding blanks, the last one perhaps
`Connection: close`), cuts the bytes at random points, and feeds the same pieces to sr's
connection and to `h11.Connection(h11.SERVER)`. Both must see the same requests (method,
target, headers as sr exposes them, body), the same end of stream, and agree on whether the
connection stays open. sr's answers, parsed by an h11 client that sent the same requests,
must give back exactly the status, headers and body the test asked for, framed as HTTP
requires (no body for HEAD, 204 and 304; `connection: close` when the connection ends).
"""

from __future__ import annotations

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sr.http.connection import CLOSED, END, NEED_DATA, PAUSED, ServerConnection
from sr.http.parse import RequestHead

_TOKEN_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
# Names the server reads itself (framing, keep-alive, single-valued); the test sets those.
_RESERVED = {"host", "content-length", "transfer-encoding", "connection", "expect"}
_RESERVED |= {"authorization", "x-request-timeout-ms", "upgrade"}

header_names = st.text(_TOKEN_CHARS, min_size=1, max_size=12).filter(
    lambda name: name.lower() not in _RESERVED
)
# Visible ASCII with inner blanks; surrounding blanks are stripped by both sides.
header_values = st.builds(
    lambda pad, core, tail: pad + core + tail,
    st.sampled_from(["", " ", "\t", "  "]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E) | st.just(" "), max_size=20)
    .map(str.strip)
    .filter(bool),
    st.sampled_from(["", " ", "\t"]),
)
targets = st.builds(
    lambda parts, query: "/" + "/".join(parts) + (f"?{query}" if query else ""),
    st.lists(st.text("abcxyz019-._~%", min_size=1, max_size=8), max_size=3),
    st.one_of(st.none(), st.text("abc=&19", min_size=1, max_size=10)),
)


@st.composite
def requests(draw, last: bool) -> dict:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"]))
    framing = (
        "none"
        if method in ("GET", "HEAD")
        else draw(st.sampled_from(["none", "length", "chunked"]))
    )
    body = b"" if framing == "none" else draw(st.binary(max_size=300))
    headers = [(draw(st.sampled_from(["Host", "host", "HOST"])), "example.test")]
    headers += draw(st.lists(st.tuples(header_names, header_values), max_size=4))
    chunk_sizes: list[int] = []
    if framing == "length":
        headers.append(
            (draw(st.sampled_from(["Content-Length", "content-length"])), str(len(body)))
        )
    elif framing == "chunked":
        headers.append(
            (draw(st.sampled_from(["Transfer-Encoding", "transfer-encoding"])), "chunked")
        )
        left = len(body)
        while left:
            size = draw(st.integers(1, left))
            chunk_sizes.append(size)
            left -= size
    close = last and draw(st.booleans())
    if close:
        headers.append(("Connection", "close"))
    headers = draw(st.permutations(headers))
    answer = {
        "status": draw(st.sampled_from([200, 201, 204, 304, 404, 500])),
        "headers": [(b"x-answer", draw(st.text("abc123", min_size=1, max_size=6)).encode())],
        "body": draw(st.binary(max_size=200)),
    }
    return {
        "method": method,
        "target": draw(targets),
        "headers": headers,
        "body": body,
        "chunked": framing == "chunked",
        "chunk_sizes": chunk_sizes,
        "close": close,
        "answer": answer,
    }


def wire(request: dict) -> bytes:
    head = f"{request['method']} {request['target']} HTTP/1.1\r\n"
    head += "".join(f"{name}:{value}\r\n" for name, value in request["headers"])
    out = head.encode() + b"\r\n"
    if request["chunked"]:
        at = 0
        for size in request["chunk_sizes"]:
            out += b"%x\r\n%s\r\n" % (size, request["body"][at : at + size])
            at += size
        out += b"0\r\n\r\n"
    elif request["body"]:
        out += request["body"]
    return out


@st.composite
def traffic(draw) -> tuple[list[dict], list[bytes]]:
    count = draw(st.integers(1, 4))
    reqs = [draw(requests(last=i == count - 1)) for i in range(count)]
    data = b"".join(wire(r) for r in reqs)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=8))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return reqs, [p for p in pieces if p]


def run_sr(reqs: list[dict], pieces: list[bytes]) -> tuple[list, list[bytes], bool]:
    """Requests as sr's connection sees them, its answer bytes, and whether it stayed open."""
    connection = ServerConnection(16384)
    seen: list = []
    answers: list[bytes] = []
    open_ = True
    for piece in [*pieces, b""]:
        connection.receive_data(piece)
        while open_:
            event = connection.next_event()
            if event is NEED_DATA:
                break
            if event is CLOSED:
                seen.append("closed")
                break
            if isinstance(event, RequestHead):
                seen.append([event.method, event.target, list(event.headers), b""])
            elif type(event) is bytes:
                seen[-1][3] += event
            elif event is END:
                seen[-1].append("end")
            elif event is PAUSED:  # complete: answer it, as the test asked
                answer = reqs[len(answers)]["answer"]
                answers.append(
                    connection.answer(answer["status"], answer["headers"], answer["body"])
                )
                if not connection.keep_alive:
                    open_ = False
                    break
                connection.start_next_cycle()
    return seen, answers, open_


def run_h11(reqs: list[dict], pieces: list[bytes]) -> tuple[list, bool]:
    connection = h11.Connection(h11.SERVER)
    seen: list = []
    answered = 0
    open_ = True
    for piece in [*pieces, b""]:
        connection.receive_data(piece)
        while open_:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.ConnectionClosed):
                seen.append("closed")
                break
            if isinstance(event, h11.Request):
                seen.append([event.method, event.target, list(event.headers), b""])
            elif isinstance(event, h11.Data):
                seen[-1][3] += event.data
            elif isinstance(event, h11.EndOfMessage):  # complete: answer it
                seen[-1].append("end")
                answer = reqs[answered]["answer"]
                answered += 1
                connection.send(h11.Response(status_code=answer["status"], headers=[]))
                connection.send(h11.EndOfMessage())
                if connection.our_state is not h11.DONE:
                    open_ = False
                    break
                connection.start_next_cycle()
    return seen, open_


def check_answers(reqs: list[dict], answers: list[bytes]) -> None:
    """sr's answer bytes through an h11 client that sent the same requests."""
    client = h11.Connection(h11.CLIENT)
    for request, data in zip(reqs, answers, strict=True):
        headers = [(name, value.strip(" \t")) for name, value in request["headers"]]
        client.send(
            h11.Request(method=request["method"], target=request["target"], headers=headers)
        )
        if request["body"]:
            client.send(h11.Data(data=request["body"]))
        client.send(h11.EndOfMessage())
        client.receive_data(data)
        response = client.next_event()
        assert isinstance(response, h11.Response)
        asked = request["answer"]
        assert response.status_code == asked["status"]
        got = dict(response.headers)
        assert got[b"x-answer"] == asked["headers"][0][1]
        no_body = request["method"] == "HEAD" or asked["status"] in (204, 304)
        if asked["status"] in (204, 304):
            assert b"content-length" not in got
        else:
            assert got[b"content-length"] == str(len(asked["body"])).encode()
        assert (got.get(b"connection") == b"close") == request["close"]
        body = b""
        while True:
            event = client.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            else:
                assert isinstance(event, h11.EndOfMessage), event
                break
        assert body == (b"" if no_body else asked["body"])
        assert client.next_event() in (h11.PAUSED, h11.NEED_DATA)
        if client.our_state is h11.DONE and client.their_state is h11.DONE:
            client.start_next_cycle()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traffic())
def test_sr_and_h11_see_the_same_requests_and_sr_answers_as_asked(case):
    reqs, pieces = case
    sr_seen, answers, sr_open = run_sr(reqs, pieces)
    h11_seen, h11_open = run_h11(reqs, pieces)
    assert sr_seen == h11_seen
    assert sr_open == h11_open
    assert len(answers) == len(reqs)
    check_answers(reqs, answers)
