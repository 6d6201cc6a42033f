"""How the pool talks to one worker: a small interface with two implementations.

* `HttpTransport` — httpx over a Unix socket (managed workers) or a base URL (attached
  workers), one keep-alive client per replica.
* `InProcessTransport` — calls `WorkerService.handle(method, path, body)` directly.

Deadlines are not the transport's business: the caller's cancel scope bounds the exchange.
A transport raises `TransportError` for anything that is not an HTTP answer.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

JSON_HEADERS = {"content-type": "application/json"}


class TransportError(Exception):
    """The exchange did not produce an HTTP answer (refused, reset, closed, ...)."""


class Transport(Protocol):
    async def exchange(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]: ...

    async def aclose(self) -> None: ...


class HttpTransport:
    def __init__(self, *, uds: str | None = None, base_url: str | None = None) -> None:
        transport = httpx.AsyncHTTPTransport(uds=uds, retries=0)
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=base_url or "http://worker",
            timeout=httpx.Timeout(None),  # deadlines come from the caller's cancel scope
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    async def exchange(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            response = await self._client.request(
                method, path, content=body or None, headers=JSON_HEADERS if body else None
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
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        status, headers, payload = await self._service.handle(method, path, body)
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
