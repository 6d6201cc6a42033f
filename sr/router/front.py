"""Fronts: how a family of HTTP routes meets the router's one dispatch path.

sr.router.app `_native` reads the body, resolves the deployment, consults the cache,
dispatches with the caller's deadline and hang-up, observes metrics and answers. What
differs between API families is only at the edges, and a front holds exactly that:

- `parse(raw)`: the body as a routed request: the worker route, the native body, and the
  `model` named (None: the router's only deployment);
- `forward(request, raw, artifact)`: the bytes the worker gets, naming the artifact;
- `answer(request, payload, artifact)`: a worker's 2xx answer as this family answers;
- `worker_error(request, status, payload)`: a worker's non-2xx answer in this family's shape;
- `error(error)`: the router's own RequestError in this family's shape.

`NativeFront` is sr's own (OpenAI-shaped) family; the TEI routes use sr.router.tei.TeiFront.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from sr.errors import RequestError
from sr.router.rewrite import answer_with_public_model, forward_native, parse_native_body


class Routed(Protocol):
    @property
    def route(self) -> str: ...  # the worker route
    @property
    def body(self) -> dict[str, Any]: ...  # the native body, without `model`
    @property
    def model(self) -> str | None: ...


class Front(Protocol):
    @property
    def route(self) -> str: ...  # the path the caller used (the metrics label)

    def parse(self, raw: bytes) -> Routed: ...
    def forward(self, request: Any, raw: bytes, artifact: str) -> bytes: ...
    def answer(self, request: Any, payload: bytes, artifact: str) -> bytes: ...
    def worker_error(self, request: Any, status: int, payload: bytes) -> tuple[int, bytes]: ...
    def error(self, error: RequestError) -> tuple[int, list[tuple[bytes, bytes]], bytes]: ...


@attrs.frozen
class NativeRequest:
    route: str
    body: dict[str, Any]
    model: str


@attrs.frozen
class NativeFront:
    """The native routes: `model` is required; the caller's bytes go to the worker and its
    answer comes back, each with `model` renamed in place (sr.router.rewrite); a worker's
    errors pass through as they are (the shape is already sr's)."""

    route: str

    def parse(self, raw: bytes) -> NativeRequest:
        body, model = parse_native_body(raw)
        return NativeRequest(self.route, body, model)

    def forward(self, request: NativeRequest, raw: bytes, artifact: str) -> bytes:
        return forward_native(raw, request.body, request.model, artifact)

    def answer(self, request: NativeRequest, payload: bytes, artifact: str) -> bytes:
        return answer_with_public_model(payload, artifact, request.model)

    def worker_error(
        self, request: NativeRequest, status: int, payload: bytes
    ) -> tuple[int, bytes]:
        return status, payload

    def error(self, error: RequestError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        headers = [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
        return error.status, headers, error.body()
