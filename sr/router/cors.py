"""Cross-origin requests (CORS), opt-in per listener: `listeners[0].cors_allow_origins`.

Rules (the Fetch standard's CORS protocol, the parts a JSON API needs):
- Off unless the listener lists origins. An origin is `scheme://host[:port]` exactly as a
  browser sends it in `Origin`; `"*"` allows any origin.
- A preflight is `OPTIONS` with `Origin` and `Access-Control-Request-Method`. It is answered
  here, before the API key check: browsers never send credentials on a preflight. An allowed
  origin gets 204 with the methods and the request headers it asked for; a refused one gets
  403 naming the origin, and the browser then refuses the real request.
- Every answer to an allowed origin, the preflight's included, carries one
  `Access-Control-Allow-Origin` (the origin itself, so the answer may be cached per origin:
  `Vary: Origin`) and exposes sr's own response headers (request id, replica, timings) to
  the page's script. A request from an origin not allowed is refused (sr.router.guard).
- Credentials (cookies) are never allowed: sr authenticates with a bearer key, which a page
  sends as a header and which the preflight lets through.
"""

from __future__ import annotations

from collections.abc import Iterable

ALLOWED_METHODS = b"GET, POST, OPTIONS"
# Headers a browser does not expose to a page unless the answer says so.
EXPOSED_HEADERS = (
    b"x-request-id, x-sr-replica, x-total-time, x-tokenization-time, x-queue-time,"
    b" x-inference-time, x-compute-time, x-compute-tokens, x-compute-characters, retry-after"
)
PREFLIGHT_MAX_AGE_S = b"600"
_ANY = "*"


class CorsPolicy:
    def __init__(self, allow_origins: Iterable[str] = ()) -> None:
        origins = {origin.rstrip("/") for origin in allow_origins}
        self.enabled = bool(origins)
        self._any = _ANY in origins
        self._origins = {origin.encode("latin-1") for origin in origins if origin != _ANY}

    def allows(self, origin: bytes) -> bool:
        return self._any or origin in self._origins

    def is_preflight(self, method: str, origin: bytes | None, request_method: bytes | None):
        return self.enabled and method == "OPTIONS" and origin is not None and bool(request_method)

    def preflight_headers(self, request_headers: bytes | None) -> list[tuple[bytes, bytes]]:
        """The headers a 204 answer to an allowed preflight adds to `answer_headers`' (a
        second Access-Control-Allow-Origin would make browsers refuse the preflight)."""
        headers = [
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-max-age", PREFLIGHT_MAX_AGE_S),
        ]
        if request_headers:
            # Whatever the page asked to send: sr reads the ones it knows and ignores the rest.
            headers.append((b"access-control-allow-headers", request_headers))
        return headers

    def answer_headers(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """The headers an answer to `origin` carries; none when CORS is off or it is refused."""
        if not self.enabled or origin is None or not self.allows(origin):
            return []
        return [
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", EXPOSED_HEADERS),
            (b"vary", b"Origin"),
        ]
