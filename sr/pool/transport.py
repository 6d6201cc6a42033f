"""How the pool talks to one worker: a small interface with two implementations.

* `HttpTransport` — HTTP/1.1 (sr.http.client, a strict client over trio) over a Unix
  socket (managed workers) or to a base URL (attached workers), kept-alive connections per
  replica. `HttpxTransport` is the same over httpx, kept for benchmarks: docs/benchmarks.md
  measures both on the router-to-worker hop.
* `InProcessTransport` — calls `WorkerService.handle(method, path, body)` directly.

Deadlines are not the transport's business: the caller's cancel scope bounds the exchange.
A transport raises a `sr.errors.TransportError` of the phase that failed (ConnectFailed,
WriteFailed, ReadFailed) for anything that is not an HTTP answer: sr.http.client raises
them itself, httpx's errors are translated here (`_phase_error`), and sr.pool.outcome maps
them to pool outcomes. Nothing else wraps them.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

import httpx

from sr.errors import ConnectFailed, ReadFailed, TransportError, WriteFailed
from sr.http.client import Http1Pool

__all__ = ["HttpTransport", "HttpxTransport", "InProcessTransport", "Transport", "TransportError"]

JSON_HEADERS = {"content-type": "application/json"}


class Transport(Protocol):
    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]: ...

    async def aclose(self) -> None: ...


class HttpTransport:
    """Managed workers (`uds`): sr.http.client. Attached workers (`base_url`, which may be
    https): httpx, whose TLS support the small client does not have. `api_key` is sent as
    `Authorization: Bearer` on every exchange; `ssl_context` verifies https workers (None:
    httpx's default, the certifi bundle); `tls_server_name`, when given, is the name the
    certificate must carry (and the SNI sent) instead of the URL's host: a discovered
    worker is dialled by address but holds a certificate for the service's name."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self._pool: Http1Pool | None = None
        self._httpx: HttpxTransport | None = None
        if uds is not None:
            self._pool = Http1Pool(uds=uds)
        else:
            self._httpx = HttpxTransport(
                base_url=base_url,
                api_key=api_key,
                ssl_context=ssl_context,
                tls_server_name=tls_server_name,
            )

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        if self._pool is not None:
            return await self._pool.request(method, path, body, request_id=request_id)
        assert self._httpx is not None
        return await self._httpx.exchange(method, path, body, request_id=request_id)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._httpx is not None:
            await self._httpx.aclose()


class HttpxTransport:
    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self._extensions = {"sni_hostname": tls_server_name} if tls_server_name else None
        verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        transport = httpx.AsyncHTTPTransport(uds=uds, retries=0, verify=verify)
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=base_url or "http://worker",
            timeout=httpx.Timeout(None),  # deadlines come from the caller's cancel scope
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            headers={"authorization": f"Bearer {api_key}"} if api_key else None,
        )

    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = dict(JSON_HEADERS) if body else {}
        if request_id is not None:
            headers["x-request-id"] = request_id
        try:
            response = await self._client.request(
                method,
                path,
                content=body or None,
                headers=headers or None,
                extensions=self._extensions,
            )
        except httpx.HTTPError as error:
            raise _phase_error(error) from error
        return response.status_code, dict(response.headers), response.content

    async def aclose(self) -> None:
        await self._client.aclose()


def _phase_error(error: httpx.HTTPError) -> TransportError:
    """httpx's error as the phase it failed in: connecting (also a connect timeout or a
    refused pool slot), writing the request, or anything after it was written."""
    text = _describe_httpx_error(error)
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return ConnectFailed(text)
    if isinstance(error, httpx.WriteError | httpx.WriteTimeout):
        return WriteFailed(text)
    return ReadFailed(text)


def _describe_httpx_error(error: BaseException) -> str:
    """`ConnectError: ...`; an error with an empty message (httpx's TLS failures) is
    described by its first cause that says something: the reason (an unknown CA, a name
    mismatch) is the inventory's only clue."""
    text = f"{type(error).__name__}: {error}".rstrip(": ")
    if str(error):
        return text
    cause = error.__cause__ or error.__context__
    for _ in range(5):
        if cause is None:
            break
        if said := str(cause):
            return f"{text} ({type(cause).__name__}: {said})"
        cause = cause.__cause__ or cause.__context__
    return text


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
