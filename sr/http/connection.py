"""The server side of one HTTP/1.1 connection, without I/O: bytes in, events out; answers in,
bytes out. sr.http.server's Trio loop feeds it what it reads and writes what it returns; the
ASGI adapter and the worker's handler see a request only through it. h11's `_state.py` is
the model: two sides, each in one state, moved only by the transitions in `_TRANSITIONS`.

    CALLER (the requests)                       SERVER (the answers)
    IDLE ──head──> SEND_BODY ──END──> DONE      IDLE ──caller's head──> SEND_ANSWER
      │              │                            │                       │ 100 Continue
      ├──EOF──> CLOSED <──EOF──┤                  └─refusal─┐    answer ──┤
      └─unparsable─> ERROR <─unparsable─┘                   v             v
                                                        MUST_CLOSE <── DONE (unless kept alive)

Rules:
1. One request at a time. What a pipelining caller sends early waits in the parser: once
   the caller side is DONE, `next_event()` says PAUSED and parses nothing further until
   `start_next_cycle()`, which needs both sides DONE.
2. Events come in arrival order: a `RequestHead`, body chunks (`bytes`), `END`; `CLOSED`
   once the caller closed its side (what it sent before still comes first).
3. An answer is one piece: head and body from `answer()`, framed by sr.http.framing from
   the request's method and the status (the one place that decides framing). `100 Continue`
   goes at most once, only before the answer and before any of the body has arrived.
4. The connection carries another request only if the caller asked for it (HTTP/1.1
   without `Connection: close`), the body was read to its end (the rest of a body cannot be
   told apart from a next request), and the driver did not ask to close (shutdown).
   Otherwise the answer says `connection: close` and the server side ends MUST_CLOSE.
5. A request that cannot be parsed puts the caller side in ERROR (the RequestError is
   raised by `next_event()`); it, or a request that broke a limit, is answered at most once
   with `refusal()`, and the connection closes.
6. A wrong move (two answers, a next cycle before both sides are done) is a bug in the
   driver: ConnectionStateError, with nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Final, NoReturn

from sr.errors import RequestError
from sr.http.framing import answer_framing
from sr.http.parse import CLOSED, END, NEED_DATA, Marker, RequestHead, RequestParser
from sr.http.wire import CONTINUE, answer_head

__all__ = [
    "CLOSED",
    "END",
    "NEED_DATA",
    "PAUSED",
    "ConnectionStateError",
    "ServerConnection",
    "Side",
    "State",
]

PAUSED: Final = Marker("PAUSED")  # the request is complete; the next waits for its turn


class _Constant:
    """A named constant compared by identity, like an Enum member but without the Enum
    metaclass's attribute hook: on Python 3.11 every `State.DONE` read through an Enum class
    runs it, which cost the server about 30,000 instructions per request
    (bench.bench_instructions) over the reads of one request cycle."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Side(_Constant):
    __slots__ = ()
    CALLER: ClassVar[Side]
    SERVER: ClassVar[Side]


class State(_Constant):
    __slots__ = ()
    IDLE: ClassVar[State]  # between requests
    SEND_BODY: ClassVar[State]  # caller: the head is in, the body is coming
    SEND_ANSWER: ClassVar[State]  # server: a request to answer
    DONE: ClassVar[State]  # this side's part of the cycle is complete
    MUST_CLOSE: ClassVar[State]  # server: answered, and the connection closes
    CLOSED: ClassVar[State]  # caller: it closed its side
    ERROR: ClassVar[State]  # caller: it sent a request that cannot be parsed


class _Move(_Constant):
    __slots__ = ()
    HEAD: ClassVar[_Move]  # a request head (the caller's; the server side sees it too)
    END: ClassVar[_Move]  # the end of a request body
    EOF: ClassVar[_Move]  # the caller closed its side
    UNPARSABLE: ClassVar[_Move]  # a request that cannot be parsed
    CONTINUE: ClassVar[_Move]  # `100 Continue`
    ANSWER: ClassVar[_Move]  # the final answer, the connection kept alive
    LAST_ANSWER: ClassVar[_Move]  # the final answer, after which the connection closes
    REFUSAL: ClassVar[_Move]  # an answer to a request that cannot be served; then close


for _kind in (Side, State, _Move):
    for _name in _kind.__annotations__:
        setattr(_kind, _name, _kind(_name))
del _kind, _name

S, M = State, _Move
_TRANSITIONS: dict[Side, dict[State, dict[_Move, State]]] = {
    Side.CALLER: {
        S.IDLE: {M.HEAD: S.SEND_BODY, M.EOF: S.CLOSED, M.UNPARSABLE: S.ERROR},
        S.SEND_BODY: {M.END: S.DONE, M.EOF: S.CLOSED, M.UNPARSABLE: S.ERROR},
        S.DONE: {},  # until start_next_cycle; EOF shows only after it (rules 1, 2)
        S.CLOSED: {},
        S.ERROR: {},
    },
    Side.SERVER: {
        S.IDLE: {M.HEAD: S.SEND_ANSWER, M.REFUSAL: S.MUST_CLOSE},
        S.SEND_ANSWER: {
            M.CONTINUE: S.SEND_ANSWER,
            M.ANSWER: S.DONE,
            M.LAST_ANSWER: S.MUST_CLOSE,  # rule 4
            M.REFUSAL: S.MUST_CLOSE,
        },
        S.DONE: {},
        S.MUST_CLOSE: {},
    },
}
del S, M


_CALLER_MOVES = _TRANSITIONS[Side.CALLER]
_SERVER_MOVES = _TRANSITIONS[Side.SERVER]


def _illegal(side: Side, state: State, move: _Move) -> NoReturn:
    """A move `_TRANSITIONS` does not allow (rule 6). Every state change reads the table
    in place, `_TRANSITIONS[side][state].get(move) or _illegal(...)`: no call on the way
    that succeeds, since one runs several times per request."""
    raise ConnectionStateError(f"{side.name.lower()} side in {state.name} cannot take {move.name}")


class ConnectionStateError(Exception):
    """A move the connection's state does not allow: a bug in its driver."""


class ServerConnection:
    """One connection's protocol state (module docstring). `request` is the request being
    served (None between requests). `max_body_bytes` caps what a chunked body announces
    (sr.http.parse); None: no cap here."""

    def __init__(self, max_header_bytes: int, max_body_bytes: int | None = None) -> None:
        self._parser = RequestParser(max_header_bytes, max_body_bytes)
        self.caller = State.IDLE
        self.server = State.IDLE
        self.request: RequestHead | None = None
        self.caller_closed = False  # EOF was fed (its events may still be pending)
        self._continue_sent = False

    # -- the caller's side: bytes in, events out -----------------------------------------
    def receive_data(self, data: bytes) -> None:
        """Bytes read from the caller; b"" once it closed its side."""
        if not data:
            self.caller_closed = True
        self._parser.feed(data)

    def next_event(self):
        """The next event (rule 2), NEED_DATA when more bytes are needed, or PAUSED while a
        complete request waits for its answer; raises the RequestError of a request that
        cannot be parsed."""
        if self.caller is State.DONE:
            return PAUSED
        try:
            event = self._parser.next_event()
        except RequestError:
            self.caller = _CALLER_MOVES[self.caller].get(_Move.UNPARSABLE) or _illegal(
                Side.CALLER, self.caller, _Move.UNPARSABLE
            )
            raise
        if type(event) is bytes or event is NEED_DATA:
            return event  # no move: the fast path of a body and of a read that must wait
        if event is END:
            self.caller = _CALLER_MOVES[self.caller].get(_Move.END) or _illegal(
                Side.CALLER, self.caller, _Move.END
            )
        elif event is CLOSED:
            if self.caller is not State.CLOSED and self.caller is not State.ERROR:
                self.caller = _CALLER_MOVES[self.caller].get(_Move.EOF) or _illegal(
                    Side.CALLER, self.caller, _Move.EOF
                )
        else:
            self.caller = _CALLER_MOVES[self.caller].get(_Move.HEAD) or _illegal(
                Side.CALLER, self.caller, _Move.HEAD
            )
            self.server = _SERVER_MOVES[self.server].get(_Move.HEAD) or _illegal(
                Side.SERVER, self.server, _Move.HEAD
            )
            self.request = event
        return event

    def take_complete_body(self) -> bytes | None:
        """The current request's whole body, if it is already parsed to its end in one piece
        (a small body that came with its head, or none): taken, and the caller side is DONE.
        None, with nothing taken, otherwise; then read it event by event."""
        if self.caller is not State.SEND_BODY:
            return None
        body = self._parser.take_whole_body()
        if body is not None:
            self.caller = _CALLER_MOVES[self.caller].get(_Move.END) or _illegal(
                Side.CALLER, self.caller, _Move.END
            )
        return body

    @property
    def request_complete(self) -> bool:
        """The current request's body was read to its end."""
        return self.caller is State.DONE

    def head_begun(self) -> bool:
        """Bytes of a request head that is not complete yet have arrived."""
        return self._parser.head_begun()

    # -- the server's side: answers in, bytes out ------------------------------------------
    def continue_bytes(self) -> bytes | None:
        """`100 Continue` if the request holds its body back for it (rule 3), else None."""
        request = self.request
        if (
            request is None
            or not request.expects_continue
            or self._continue_sent
            or self.server is not State.SEND_ANSWER
            or self._parser.has_pending()  # some of the body is here: it was not held back
        ):
            return None
        self.server = _SERVER_MOVES[self.server].get(_Move.CONTINUE) or _illegal(
            Side.SERVER, self.server, _Move.CONTINUE
        )
        self._continue_sent = True
        return CONTINUE

    def answer(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        *,
        length: int | None = None,
        close: bool = False,
    ) -> bytes:
        """The bytes of the final answer to the current request (rules 3 and 4): for HEAD
        its head only (`length` may declare the size of the body a GET would get), for 1xx,
        204 and 304 neither a length nor a body. `close`: the driver closes the connection
        after it (shutdown). sr.http.wire.InvalidAnswer, with nothing changed, for a head
        that cannot be written as given."""
        if self.server is not State.SEND_ANSWER:
            raise ConnectionStateError(f"no answer is due (server side {self.server.name})")
        assert self.request is not None
        close = close or not self.request.keep_alive or self.caller is not State.DONE
        data = self._framed(self.request.method, status, headers, body, length, close)
        move = _Move.LAST_ANSWER if close else _Move.ANSWER
        self.server = _SERVER_MOVES[self.server].get(move) or _illegal(
            Side.SERVER, self.server, move
        )
        return data

    def refusal(self, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
        """The bytes of an answer to a request that cannot be served (rule 5): unparsable,
        over a limit, too slow. The connection closes after it."""
        data = self._framed(b"", status, headers, body, None, True)
        self.server = _SERVER_MOVES[self.server].get(_Move.REFUSAL) or _illegal(
            Side.SERVER, self.server, _Move.REFUSAL
        )
        return data

    @property
    def answered(self) -> bool:
        return self.server is State.DONE or self.server is State.MUST_CLOSE

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may carry another request once this one is done."""
        return self.server is State.DONE

    def start_next_cycle(self) -> None:
        """Both sides are DONE: back to IDLE for the next request (rule 1)."""
        if self.caller is not State.DONE or self.server is not State.DONE:
            raise ConnectionStateError(
                f"not both sides done (caller {self.caller.name}, server {self.server.name})"
            )
        self.caller = self.server = State.IDLE
        self.request = None
        self._continue_sent = False

    @staticmethod
    def _framed(
        method: bytes,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        length: int | None,
        close: bool,
    ) -> bytes:
        declares_length, carries_body = answer_framing(method, status)
        if not declares_length:
            length = None
        elif length is None:
            length = len(body)
        head = answer_head(status, headers, length, close=close)
        return head + body if carries_body else head
