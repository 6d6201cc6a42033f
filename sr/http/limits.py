"""Every limit of sr's HTTP/1.1 server, in one object: the router's front door and the
workers use the same `HttpLimits`, each with its own values (sr.router.serve,
sr.worker.http). docs/security.md lists the defaults and why each exists.

A limit bounds what one caller can hold: a connection (open connections per listener),
a task and a buffer for a slow head, a slow body or an answer nobody reads (the three
timeouts), and memory for a large head or body (the two size caps). Each limit ends the
same way: an answer when one can still be written (408, 413, 431, 503), then the
connection closes and its buffers are freed.
"""

from __future__ import annotations

import attrs

MAX_BODY_BYTES = 4 * 1024 * 1024
# A 4 MiB body arrives in well under a second on any link that should reach this server.
BODY_TIMEOUT_S = 30.0


@attrs.frozen
class HttpLimits:
    # From the first byte of a request head to its blank line; then 408 and close.
    # hypercorn and uvicorn allow 5 s; a 16 KiB head takes milliseconds on any working
    # link, so only a slowloris client ever meets this.
    head_timeout_s: float = 10.0
    # Between requests on a kept-alive connection (no byte of a next head yet); then the
    # connection closes without an answer. Longer than the 60 s that proxies such as nginx
    # keep idle upstream connections, so that the proxy, not sr, closes first.
    keep_alive_timeout_s: float = 75.0
    # From the end of the head to the end of the body; then 408 and close.
    body_timeout_s: float = BODY_TIMEOUT_S
    # One answer must be written within this; a caller that does not read is dropped and
    # the answer's buffers freed.
    write_timeout_s: float = 30.0
    # Open connections per listener. At the cap the longest-idle kept-alive connection is
    # closed to make room; when none is idle, the newcomer gets 503 and is closed.
    max_connections: int = 1000
    # The request line and headers together (431), and separately a chunked body's
    # trailer section (431), which is read and dropped.
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = MAX_BODY_BYTES  # 413, from the declared length or while reading
    # After shutdown begins, requests in flight get this long before they are cut.
    graceful_timeout_s: float = 5.0
