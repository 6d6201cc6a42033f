"""Request ids: one per HTTP request, from the caller's `X-Request-Id` or made here.

Rules:
- The router takes the caller's `X-Request-Id` when it is 1-128 visible ASCII characters
  and refuses the request (400 naming the header) otherwise; without one it makes one,
  16 random bytes in hex, as unguessable as a UUID4.
- The id is echoed on every answer (`x-request-id`), sent to the worker with the request,
  and is `current` while the request is answered - in the router and in the worker - so
  error bodies (`error.request_id`, sr.errors) and log lines carry it without every
  function passing it on.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

HEADER = b"x-request-id"
MAX_CHARS = 128

# Trio gives each task a copy of its parent's context: a connection's task sets this for
# the request it is answering, and the tasks that request starts inherit it.
current: ContextVar[str | None] = ContextVar("sr_request_id", default=None)


def new_request_id() -> str:
    return os.urandom(16).hex()


# One compiled match instead of a check per character: the worker reads an id on every
# request, and the loop cost about 33k instructions there (callgrind).
_USABLE = re.compile(rb"[!-~]{1,%d}" % MAX_CHARS)


def usable(value: bytes) -> str | None:
    """`value` as a request id, or None when it is empty, too long or not visible ASCII."""
    return value.decode("ascii") if _USABLE.fullmatch(value) else None
