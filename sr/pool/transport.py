"""How the pool talks to one worker: a small interface with two implementations.

* `HttpTransport` — managed workers: HTTP/1.1 over their Unix socket with sr.http.client
  (a strict client over trio, a third of httpx's CPU per hop: docs/benchmarks.md),
  kept-alive connections per replica.
* `HttpxTransport` — attached workers (a base URL, which may be https): httpx, for its TLS;
  `api_key` is sent as `Authorization: Bearer`, `ssl_context` verifies the certificate and
  `tls_server_name` is the name it must carry (and the SNI sent) when that is not the URL's
  host: a discovered worker is dialled by address but holds its service's certificate.
* `InProcessTransport` — calls `WorkerService.handle(method, path, body, hop)` directly.

A request carries a `sr.http.hop.Hop`: the router's request id and the deployment it is
served for (the worker's `model` check, sr.worker.served_as), and, only when traces are on,
the W3C `traceparent` of the router's hop span (sr.pool.dispatch_trace). Deadlines are not the
transport's business: the caller's cancel scope bounds the exchange.
A transport raises a `sr.errors.TransportError` of the phase that failed (ConnectFailed,
WriteFailed, ReadFailed) for anything that is not an HTTP answer: sr.http.client raises
them itself, httpx's errors are translated here (`_phase_error`), and sr.pool.outcome maps
them to pool outcomes. Nothing else wraps them.

httpx is imported by the first attached worker's transport, not with this module: it and
what it pulls in were 0.14 s of every `sr serve`'s own start on a 2-core host (listening
0.54 -> 0.44 s), and a router with only managed workers never uses it.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Protocol

from sr.errors import ConnectFailed, ReadFailed, TransportError, WriteFailed
from sr.http.client import Http1Pool
from sr.http.hop import NO_HOP, Hop

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpTransport", "HttpxTransport", "InProcessTransport", "Transport", "TransportError"]

JSON_HEADERS = {"content-type": "application/json"}


class Transport(Protocol):
    async def exchange(
        self, method: str, path: str, body: bytes = b"", hop: Hop = NO_HOP
    ) -> tuple[int, dict[str, str], bytes]: ...

    async def aclose(self) -> None: ...


# A managed worker over its Unix socket: sr.http.client's kept-alive connections are a
# Transport as they are (`Http1Pool.exchange`), with no layer between the pool and them.
HttpTransport = Http1Pool


class HttpxTransport:
    """An attached worker at `base_url` (module docstring); `uds` only for the benchmark
    that measures httpx against sr's client on the same socket (bench/bench_transport.py)."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        import httpx

        self._http_error = httpx.HTTPError  # what `exchange` translates, without an import
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
        self, method: str, path: str, body: bytes = b"", hop: Hop = NO_HOP
    ) -> tuple[int, dict[str, str], bytes]:
        headers = dict(JSON_HEADERS) if body else {}
        if hop.request_id is not None:
            headers["x-request-id"] = hop.request_id
        if hop.traceparent is not None:
            headers["traceparent"] = hop.traceparent
        if hop.deployment is not None:
            headers["x-sr-deployment"] = hop.deployment
        try:
            response = await self._client.request(
                method,
                path,
                content=body or None,
                headers=headers or None,
                extensions=self._extensions,
            )
        except self._http_error as error:
            raise _phase_error(error) from error
        return response.status_code, dict(response.headers), response.content

    async def aclose(self) -> None:
        await self._client.aclose()


def _phase_error(error: httpx.HTTPError) -> TransportError:
    """httpx's error as the phase it failed in: connecting (also a connect timeout or a
    refused pool slot), writing the request, or anything after it was written."""
    import httpx

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
        self, method: str, path: str, body: bytes = b"", hop: Hop = NO_HOP
    ) -> tuple[int, dict[str, str], bytes]:
        status, headers, payload = await self._service.handle(method, path, body, hop)
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
