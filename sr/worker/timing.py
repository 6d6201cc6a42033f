"""Per-request timings of a worker, answered as TEI's response headers.

Names and units are text-embeddings-inference's (its router's ResponseMetadata): whole
milliseconds, cut down as TEI cuts them, and a token count. What each means here:

- `x-total-time`, `x-compute-time`: from `WorkerService.handle` taking the request to its
  answer being ready (the same number, as in TEI).
- `x-tokenization-time`: from taking the request until its rows reach the engine: parsing,
  validation and tokenization.
- `x-queue-time`: from the rows reaching the engine until the first forward holding one of
  them starts on the device thread.
- `x-inference-time`: the time the forwards holding its rows took (a request whose rows
  are cut into several batches adds them up; time spent on other requests' forwards in
  between is neither queue nor inference).
- `x-compute-tokens`: the tokens of the request's rows (its `usage.prompt_tokens`).
- `x-compute-characters`: the characters of the texts it tokenized (a rerank pair counts
  the query once per document, as it is tokenized; token-id input counts none).

How the numbers get here without touching each task's signature: `handle` opens a
`RequestTiming` for a POST route (a context manager that sets the `current()` context
variable for the request's Trio task); `Engine.compute`, awaited in that same task, adds
its submission's numbers. Nothing is recorded when no timing is open (engine tests,
benchmarks). The cost is a few clock reads per request.

Only a successful answer whose rows reached the engine carries the headers: an error, or a
route that computes nothing (/v1/tokenize), has no queue or inference to report, and
TEI sends none there either.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from typing import Any

TOTAL_TIME = "x-total-time"
COMPUTE_TIME = "x-compute-time"
TOKENIZATION_TIME = "x-tokenization-time"
QUEUE_TIME = "x-queue-time"
INFERENCE_TIME = "x-inference-time"
COMPUTE_TOKENS = "x-compute-tokens"
COMPUTE_CHARACTERS = "x-compute-characters"
HEADER_NAMES = (
    COMPUTE_TIME, COMPUTE_TOKENS, TOTAL_TIME, TOKENIZATION_TIME, QUEUE_TIME, INFERENCE_TIME,
    COMPUTE_CHARACTERS,
)  # fmt: skip
_HEADER_BYTES = tuple(name.encode() for name in HEADER_NAMES)

_current: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "sr_request_timing", default=None
)


def current() -> RequestTiming | None:
    """The timing of the request this task is answering, if one is open."""
    return _current.get()


def note_characters(count: int) -> None:
    """The request being answered tokenized `count` more characters (none open: nothing)."""
    timing = _current.get()
    if timing is not None:
        timing.characters += count


class RequestTiming:
    """One request's clock readings (time.perf_counter seconds) and token count."""

    __slots__ = (
        "_reset", "characters", "inference_s", "queue_s", "reached_engine", "started", "tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self.started = 0.0
        self.reached_engine: float | None = None
        self.queue_s = 0.0
        self.inference_s = 0.0
        self.tokens = 0
        self.characters = 0
        self._reset: contextvars.Token[RequestTiming | None] | None = None

    def __enter__(self) -> RequestTiming:
        self.started = time.perf_counter()
        self._reset = _current.set(self)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._reset is not None:
            _current.reset(self._reset)
            self._reset = None

    def add_submission(
        self, submitted: float, first_forward: float | None, forward_s: float, tokens: int
    ) -> None:
        """What one `Engine.compute` call saw: when its rows were submitted, when the first
        forward holding one of them started (None when every row came from the cache),
        the seconds its forwards took, and its rows' tokens."""
        if self.reached_engine is None:
            self.reached_engine = submitted
        if first_forward is not None:
            self.queue_s += max(0.0, first_forward - submitted)
        self.inference_s += forward_s
        self.tokens += tokens

    @property
    def computed(self) -> bool:
        """Whether the request's rows reached the engine (its answer gets the headers)."""
        return self.reached_engine is not None

    def headers(self, now: float | None = None) -> list[tuple[bytes, bytes]]:
        """The TEI headers, in HEADER_NAMES order."""
        now = time.perf_counter() if now is None else now
        total = _ms(now - self.started)
        reached = now if self.reached_engine is None else self.reached_engine
        values = (
            total,
            str(self.tokens).encode(),
            total,
            _ms(reached - self.started),
            _ms(self.queue_s),
            _ms(self.inference_s),
            str(self.characters).encode(),
        )
        return list(zip(_HEADER_BYTES, values, strict=True))


def forwarded(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """The timing headers of a worker's answer (lower-case names), to pass on as they are."""
    return [
        (raw, headers[name].encode("latin-1"))
        for name, raw in zip(HEADER_NAMES, _HEADER_BYTES, strict=True)
        if name in headers
    ]


def _ms(seconds: float) -> bytes:
    # TEI sends Duration::as_millis(): whole milliseconds, cut down, never rounded up.
    return str(max(0, int(seconds * 1000.0))).encode()
