"""Fronts: how a family of HTTP routes meets the router's one dispatch path.

sr.router.app `_native` reads the body, resolves the deployment, consults the cache,
dispatches with the caller's deadline and hang-up, observes metrics and answers. What
differs between API families is only at the edges, and a front holds exactly that:

- `parse(raw, addressed)`: the body as a routed request: the worker route, the native body,
  and the `model` named (None: the deployment the URL addresses, `addressed`, else the
  router's only one);
- `forward(request, raw)`: the bytes the worker gets;
- `answer(request, payload)`: a worker's 2xx answer as this family answers;
- `worker_error(request, status, payload)`: a worker's non-2xx answer in this family's shape;
- `error(error)`: the router's own RequestError as this family answers it, whole (an
  answer, sr.answer): sr's own family writes it with the one writer, `error.answer()`.

`NativeFront` is sr's own (OpenAI-shaped) family; the TEI routes use sr.router.tei.TeiFront.

`model` is settled once, by the worker (sr.worker.served_as): a native request reaches it
as the caller's bytes, which may name the deployment or its artifact, and the worker's
answer names what they named, so both cross the router untouched.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from sr.answer import Answer
from sr.errors import InvalidRequest, RequestError
from sr.http.jsonbody import parse_json_object
from sr.worker.timing import WorkerTiming


class Routed(Protocol):
    @property
    def route(self) -> str: ...  # the worker route
    @property
    def body(self) -> dict[str, Any]: ...  # the native body the worker gets (the cache key)
    @property
    def model(self) -> str | None: ...


class Front(Protocol):
    @property
    def route(self) -> str: ...  # the path the caller used (the metrics label)

    @property
    def rewrites_answers(self) -> bool: ...  # `answer` reads the payload (not as it is)

    def parse(self, raw: bytes, addressed: str | None = None) -> Routed: ...
    def forward(self, request: Any, raw: bytes) -> bytes: ...
    def answer(self, request: Any, payload: bytes) -> bytes: ...
    def worker_error(self, request: Any, status: int, payload: bytes) -> tuple[int, bytes]: ...
    def error(self, error: RequestError) -> Answer: ...
    def timing_headers(self, timing: WorkerTiming) -> list[tuple[bytes, bytes]]: ...


@attrs.frozen
class NativeRequest:
    route: str
    body: dict[str, Any]
    model: str | None


@attrs.frozen
class NativeFront:
    """The native routes: `model` is required unless the URL addresses a deployment; the
    caller's bytes go to the worker and its answer comes back as they are, errors too (the
    shape is already sr's)."""

    route: str
    worker_route: str = ""  # the worker's route when it differs (an alias such as /embeddings)
    rewrites_answers = False

    def parse(self, raw: bytes, addressed: str | None = None) -> NativeRequest:
        body = parse_json_object(raw)  # parsed once, to find the deployment and cache key
        model = body.get("model")
        if model is None:
            if addressed is not None:
                return NativeRequest(self.worker_route or self.route, body, None)
            raise InvalidRequest("model: field is required")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: must be a non-empty string")
        return NativeRequest(self.worker_route or self.route, body, model)

    def forward(self, request: NativeRequest, raw: bytes) -> bytes:
        return raw

    def answer(self, request: NativeRequest, payload: bytes) -> bytes:
        return payload

    def worker_error(
        self, request: NativeRequest, status: int, payload: bytes
    ) -> tuple[int, bytes]:
        return status, payload

    def error(self, error: RequestError) -> Answer:
        return error.answer()

    def timing_headers(self, timing: WorkerTiming) -> list[tuple[bytes, bytes]]:
        return []  # the usage is in the body; TEI's timing headers are for TEI's clients
