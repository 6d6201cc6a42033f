"""Per-request timings of a worker: one internal header on the hop, TEI's headers on TEI's routes.

The numbers are text-embeddings-inference's (its router's ResponseMetadata): whole
milliseconds, cut down as TEI cuts them, and counts. What each means here:

- total (TEI's `x-total-time` and `x-compute-time`): from `WorkerService.handle` taking
  the request to its answer being ready (the same number, as in TEI).
- tokenization (`x-tokenization-time`): from taking the request until its rows reach the
  engine: parsing, validation and tokenization.
- queue (`x-queue-time`): from the rows reaching the engine until the first forward holding
  one of them starts on the device thread.
- inference (`x-inference-time`): the time the forwards holding its rows took (a request
  whose rows are cut into several batches adds them up; time spent on other requests'
  forwards in between is neither queue nor inference).
- tokens (`x-compute-tokens`): the tokens of the request's rows (its `usage.prompt_tokens`).
- characters (`x-compute-characters`): the characters of the texts it tokenized (a rerank
  pair counts the query once per document, as it is tokenized; token-id input counts none).

On the wire: a worker answers one header, `x-sr-timing: TOTAL TOKENIZATION QUEUE INFERENCE
TOKENS CHARACTERS` (six whole numbers, the times in microseconds, so that the router's
histograms and bench/bench_stages.py see a 5 ms request's parts), not TEI's seven: the
router reads it once for its metrics and its access log, and writes TEI's seven headers
only on TEI's routes, whose clients read them (sr.router.tei). Every other answer carries
none: each header is parsed, checked and written on every hop and answer, and nobody reads
them there.

How the numbers get here without touching each task's signature: `handle` opens a
`RequestTiming` for a POST route (a context manager that sets the `current()` context
variable for the request's Trio task); `Engine.compute`, awaited in that same task, adds
its submission's numbers. Nothing is recorded when no timing is open (engine tests,
benchmarks). The cost is a few clock reads per request.

Only a successful answer whose rows reached the engine carries the header: an error, or a
route that computes nothing (/v1/tokenize), has no queue or inference to report, and TEI
sends none there either.
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

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
TIMING_HEADER = b"x-sr-timing"  # the worker's answer, read by the router
TIMING_KEY = TIMING_HEADER.decode()  # how the router's hop client names it
# Six whole numbers: one C call checks them all (a check per field cost the router about
# 20 Python calls a request).
_WELL_FORMED = re.compile(r"[0-9]+ [0-9]+ [0-9]+ [0-9]+ [0-9]+ [0-9]+")

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
        "_reset", "characters", "forwards", "inference_s", "queue_s", "reached_engine",
        "started", "tokens",
    )  # fmt: skip

    def __init__(self) -> None:
        self.started = 0.0
        self.reached_engine: float | None = None
        self.queue_s = 0.0
        self.inference_s = 0.0
        self.tokens = 0
        self.characters = 0
        # Only for a traced request (sr.worker.tracing): the engine appends each forward
        # holding its rows, (started, seconds, rows, padded tokens, requests sharing it).
        self.forwards: list[tuple[float, float, int, int, int]] | None = None
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

    def header(self, now: float | None = None) -> tuple[bytes, bytes]:
        """The `x-sr-timing` header of the answer."""
        now = time.perf_counter() if now is None else now
        reached = now if self.reached_engine is None else self.reached_engine
        # Formatted in one step: `%d` cuts a float down as int() does, and no field can be
        # negative (perf_counter readings taken in order; sums of times, each at least 0).
        return TIMING_HEADER, b"%d %d %d %d %d %d" % (
            (now - self.started) * 1_000_000.0,
            (reached - self.started) * 1_000_000.0,
            self.queue_s * 1_000_000.0,
            self.inference_s * 1_000_000.0,
            self.tokens,
            self.characters,
        )


class WorkerTiming(NamedTuple):
    """A worker's `x-sr-timing`, as the router reads it (microseconds and counts)."""

    total_us: int
    tokenization_us: int
    queue_us: int
    inference_us: int
    tokens: int
    characters: int

    @classmethod
    def read(cls, headers: Mapping[str, str]) -> WorkerTiming | None:
        """The timing of a worker's answer (its headers as the hop client gives them), None
        without a well-formed one (an error, an attached worker of another version)."""
        value = headers.get(TIMING_KEY)
        if value is None or _WELL_FORMED.fullmatch(value) is None:
            return None
        return cls(*map(int, value.split(" ")))

    def tei_headers(self) -> list[tuple[bytes, bytes]]:
        """TEI's seven timing headers, in HEADER_NAMES order: whole milliseconds, cut down
        as TEI's Duration::as_millis() cuts them, never rounded up."""
        total = b"%d" % (self.total_us // 1000)
        values = (
            total, b"%d" % self.tokens, total, b"%d" % (self.tokenization_us // 1000),
            b"%d" % (self.queue_us // 1000), b"%d" % (self.inference_us // 1000),
            b"%d" % self.characters,
        )  # fmt: skip
        return list(zip(_HEADER_BYTES, values, strict=True))
