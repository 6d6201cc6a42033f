"""How the pool talks to one worker: a small interface with two implementations.

* `HttpTransport` — HTTP/1.1 (sr.pool.http1, a strict client over trio) over a Unix
  socket (managed workers) or to a base URL (attached workers), kept-alive connections per
  replica. `HttpxTransport` is the same over httpx, kept for benchmarks: docs/benchmarks.md
  measures both on the router-to-worker hop.
* `InProcessTransport` — calls `WorkerService.handle(method, path, body)` directly.

Deadlines are not the transport's business: the caller's cancel scope bounds the exchange.
A transport raises `TransportError` for anything that is not an HTTP answer.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from sr.pool.http1 import Http1Error, Http1Pool

JSON_HEADERS = {"content-type": "application/json"}


class TransportError(Exception):
    """The exchange did not produce an HTTP answer (refused, reset, closed, ...)."""


class Transport(Protocol):
    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]: ...

    async def aclose(self) -> None: ...


class HttpTransport:
    """Managed workers (`uds`): sr.pool.http1. Attached workers (`base_url`, which may be
    https): httpx, whose TLS support the small client does not have."""

    def __init__(self, *, uds: str | None = None, base_url: str | None = None) -> None:
        self._inner: Http1Transport | HttpxTransport
        if uds is not None:
            self._inner = Http1Transport(Http1Pool(uds=uds))
        else:
            self._inner = HttpxTransport(base_url=base_url)

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        return await self._inner.exchange(method, path, body, request_id=request_id)

    async def aclose(self) -> None:
        await self._inner.aclose()


class Http1Transport:
    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            return await self.pool.request(method, path, body, request_id=request_id)
        except Http1Error as error:
            raise TransportError(str(error)) from error

    async def aclose(self) -> None:
        await self.pool.aclose()


class HttpxTransport:
    def __init__(self, *, uds: str | None = None, base_url: str | None = None) -> None:
        transport = httpx.AsyncHTTPTransport(uds=uds, retries=0)
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=base_url or "http://worker",
            timeout=httpx.Timeout(None),  # deadlines come from the caller's cancel scope
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = dict(JSON_HEADERS) if body else {}
        if request_id is not None:
            headers["x-request-id"] = request_id
        try:
            response = await self._client.request(
                method, path, content=body or None, headers=headers or None
            )
        except httpx.HTTPError as error:
            raise TransportError(f"{type(error).__name__}: {error}".rstrip(": ")) from error
        return response.status_code, dict(response.headers), response.content

    async def aclose(self) -> None:
        await self._client.aclose()


class InProcessTransport:
    def __init__(self, service: Any) -> None:
        self._service = service

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        status, headers, payload = await self._service.handle(
            method, path, body, request_id=request_id
        )
        return status, _header_dict(headers), payload

    async def aclose(self) -> None:
        return None


def _header_dict(headers: Any) -> dict[str, str]:
    if isinstance(headers, dict):
        return {str(k): str(v) for k, v in headers.items()}
    out = {}
    for key, value in headers or ():
        k = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        v = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        out[k.lower()] = v
    return out
