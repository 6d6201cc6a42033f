"""The router's HTTP front end: one plain ASGI callable (SPEC section 8).

Native routes parse the JSON body once, check `model`, pick the deployment, and hand the
bytes to the pool (`RouterCore.request_raw`) with `model` set to the artifact. The pool's
typed errors become the wire errors of `sr.errors`; a worker's own 4xx passes through.
Everything else here is a small read-only view (health, readiness, inventory, metrics) or
the reload trigger.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from sr.asgi import (
    BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    ClientDisconnected,
    Receive,
    Send,
    read_body,
    request_headers,
    send_error,
    send_json,
    send_response,
    serve_lifespan,
)
from sr.config.schema import SrConfig
from sr.errors import (
    InvalidApiKey,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    ReloadUnavailable,
    RequestError,
)
from sr.hang_up import EXTENSION as HANG_UP_EXTENSION
from sr.router import inventory_view
from sr.router.auth import ApiKeyCheck
from sr.router.cache import ResultCache, cache_key
from sr.router.faults import FAULTS_PATH, FaultRoute, fault_injection_enabled
from sr.router.metrics import METRICS_CONTENT_TYPE, RouterMetrics
from sr.router.rewrite import answer_with_public_model, forward_body, parse_native_body

NATIVE_ROUTES = frozenset({"/v1/embeddings", "/v1/classify", "/v1/decisions", "/v1/rerank"})
MODEL_ROUTE_PREFIX = "/v1/models/"  # GET /v1/models/{model}
TIMEOUT_HEADER = b"x-request-timeout-ms"
REPLICA_HEADER = b"x-sr-replica"
_OUTCOME_BY_CODE = {
    "overloaded": "overloaded",
    "unavailable": "unavailable",
    "timeout": "timeout",
    "worker_failed": "failed",
    "internal_error": "failed",
}
_log = logging.getLogger("sr.events")


class Reply(Protocol):
    status: int
    headers: Any
    body: bytes
    replica_id: str


class RouterCoreLike(Protocol):
    """The part of sr.pool's RouterCore the front end uses."""

    def resolve(self, model: str) -> str: ...
    async def request_raw(
        self, deployment: str, path: str, body: bytes, timeout_s: float | None = None
    ) -> Reply: ...
    def inventory(self) -> dict[str, Any]: ...
    def startup_status(self) -> dict[str, Any]: ...
    def is_ready(self) -> bool: ...


def parse_timeout_header(value: bytes | None) -> float | None:
    """X-Request-Timeout-Ms as seconds; a positive integer or InvalidRequest."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) <= 0:
        raise InvalidRequest("X-Request-Timeout-Ms: must be a positive integer (milliseconds)")
    return int(text) / 1000.0


class RouterApp:
    def __init__(
        self,
        core: RouterCoreLike,
        config: SrConfig,
        *,
        metrics: RouterMetrics,
        cache: ResultCache,
        reload: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout_s: float = BODY_READ_TIMEOUT_S,
        fault_injection: bool | None = None,
    ):
        self.core = core
        self.metrics = metrics
        self.cache = cache
        self._reload = reload
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._artifacts: dict[str, str] = {}
        self._auth = ApiKeyCheck([])
        if fault_injection is None:
            fault_injection = fault_injection_enabled(os.environ)
        self._faults = FaultRoute(core, enabled=fault_injection)
        self.apply_config(config)
        self._get_routes: dict[str, Callable[[Send], Awaitable[None]]] = {
            "/health": self._health,
            "/ready": self._ready,
            "/startup-status": self._startup_status,
            "/v1/models": self._models,
            "/api/v1/inventory/model-runtime": self._inventory,
            "/metrics": self._metrics,
        }

    def apply_config(self, config: SrConfig) -> None:
        """Adopt a (re)loaded config: artifacts, API keys, which deployments cache."""
        deployments = config.deployments
        self._artifacts = {name: d.artifact for name, d in deployments.items()}
        keys = config.listeners[0].api_keys if config.listeners else []
        self._auth = ApiKeyCheck(list(keys))
        self.cache.configure({name: len(d.placements()) for name, d in deployments.items()})

    def set_reload(self, reload: Callable[[], Awaitable[dict[str, Any]]] | None) -> None:
        self._reload = reload

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await serve_lifespan(receive, send)

    async def _http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        (authorization,) = request_headers(scope, b"authorization")
        if not self._auth.allows(path, authorization):
            error = InvalidApiKey("missing or invalid API key (Authorization: Bearer <key>)")
            error.headers["WWW-Authenticate"] = "Bearer"
            await send_error(send, error)
            return
        try:
            if path in NATIVE_ROUTES:
                if method != "POST":
                    await _method_not_allowed(send, "POST")
                    return
                await self._native(scope, receive, send, path)
            elif path in self._get_routes:
                if method not in ("GET", "HEAD"):
                    await _method_not_allowed(send, "GET")
                    return
                await self._get_routes[path](send)
            elif path.startswith(MODEL_ROUTE_PREFIX):
                if method not in ("GET", "HEAD"):
                    await _method_not_allowed(send, "GET")
                    return
                await self._model(send, path[len(MODEL_ROUTE_PREFIX) :])
            elif path == "/api/v1/reload":
                if method != "POST":
                    await _method_not_allowed(send, "POST")
                    return
                await self._reload_route(send)
            elif path == FAULTS_PATH:
                await self._faults(scope, receive, send)
            else:
                await send_error(send, NotFound(f"no route {path}"))
        except Exception as error:  # a bug must cost one 500, never the connection
            _log.exception("router_internal_error path=%s", path)
            await send_error(send, RequestError(type(error).__name__))

    async def _native(self, scope: dict[str, Any], receive: Receive, send: Send, route: str):
        started = time.perf_counter()
        deployment = ""
        outcome = "rejected"
        try:
            content_length, timeout_value = request_headers(
                scope, b"content-length", TIMEOUT_HEADER
            )
            timeout_s = parse_timeout_header(timeout_value)
            raw = await read_body(receive, content_length, self.max_body_bytes, self.body_timeout_s)
            body, model = parse_native_body(raw)
            deployment = self.core.resolve(model)
            artifact = self._artifacts.get(deployment, model)
            key = None
            if self.cache.enabled_for(deployment):
                key = cache_key(route, body)
                cached = self.cache.get(deployment, key)
                if cached is not None:
                    outcome = "cached"
                    self.metrics.cache_hits.labels(deployment).inc()
                    answer = answer_with_public_model(cached, artifact, model)
                    await send_response(send, 200, answer, [(REPLICA_HEADER, b"cache")])
                    return
            forward = forward_body(body, artifact)
            reply = await self._dispatch(scope, receive, deployment, route, forward, timeout_s)
            if reply is None:
                outcome = "canceled"
                return
            answer = reply.body
            if key is not None:
                self.cache.put(deployment, key, reply.status, answer)
            if 200 <= reply.status < 300:
                outcome = "ok"
                answer = answer_with_public_model(answer, artifact, model)
            replica = (REPLICA_HEADER, str(reply.replica_id).encode())
            await send_response(send, reply.status, answer, [replica])
        except RequestError as error:
            outcome = _OUTCOME_BY_CODE.get(error.code, "rejected")
            await send_error(send, error)
        except ClientDisconnected:
            outcome = "canceled"
        finally:
            self.metrics.observe_request(deployment, route, outcome, time.perf_counter() - started)

    async def _dispatch(
        self,
        scope: dict[str, Any],
        receive: Receive,
        deployment: str,
        route: str,
        body: bytes,
        timeout_s: float | None,
    ) -> Reply | None:
        """request_raw, cancelled if the caller hangs up first (the pool counts `canceled`);
        None when it was. Under sr's server the hang-up is noticed by its poller (the
        `sr.hang_up` extension, sr.hang_up); elsewhere by a watcher task."""
        hang_up = scope.get("extensions", {}).get(HANG_UP_EXTENSION)
        if hang_up is None:
            return await self._dispatch_own_nursery(receive, deployment, route, body, timeout_s)
        request_scope = trio.CancelScope()
        stop_watching = hang_up["watch"](request_scope)
        try:
            with request_scope:
                return await self.core.request_raw(deployment, route, body, timeout_s=timeout_s)
        finally:
            stop_watching()
        return None  # the scope was cancelled: the caller hung up

    async def _dispatch_own_nursery(
        self, receive: Receive, deployment: str, route: str, body: bytes, timeout_s: float | None
    ) -> Reply | None:
        """The same under an ASGI server without the extension (and the in-memory test
        client): a watcher task in a nursery of its own, waiting in `receive()`."""
        reply = None
        failure: RequestError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                reply = await self.core.request_raw(deployment, route, body, timeout_s=timeout_s)
            except RequestError as error:  # raised here, not wrapped in the nursery's group
                failure = error
            finally:
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return reply

    async def _health(self, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    async def _ready(self, send: Send) -> None:
        if self.core.is_ready():
            await send_json(send, 200, {"status": "ready"})
        else:
            await send_json(send, 503, {"status": "not_ready"})

    async def _startup_status(self, send: Send) -> None:
        await send_json(send, 200, self.core.startup_status())

    async def _inventory(self, send: Send) -> None:
        await send_json(send, 200, self.core.inventory())

    async def _metrics(self, send: Send) -> None:
        await send_response(send, 200, self.metrics.render(), content_type=METRICS_CONTENT_TYPE)

    async def _models(self, send: Send) -> None:
        await send_json(send, 200, {"object": "list", "data": self._model_entries()})

    async def _model(self, send: Send, name: str) -> None:
        """GET /v1/models/{name}: the deployment's entry of GET /v1/models. `name` is a
        deployment or its artifact, as in a request's `model` (artifacts may hold `/`)."""
        try:
            deployment = self._resolve_model(name)
        except RequestError as error:
            await send_error(send, error)
            return
        for entry in self._model_entries():
            if entry["id"] == deployment:
                await send_json(send, 200, entry)
                return
        await send_error(send, ModelNotFound(f"model {name!r} is not served here"))

    def _resolve_model(self, name: str) -> str:
        try:
            return self.core.resolve(name)
        except ModelNotFound:
            if not name.endswith("/") or not name.rstrip("/"):
                raise
            return self.core.resolve(name.rstrip("/"))  # a trailing slash, as in a body

    def _model_entries(self) -> list[dict[str, Any]]:
        data = []
        for name, deployment in inventory_view.deployments(self.core.inventory()):
            members = inventory_view.replicas(deployment)
            ready = deployment.get("ready_replicas")
            if ready is None:
                ready = sum(1 for r in members if r.get("ready"))
            desired = deployment.get("desired_replicas", len(members))
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "artifact": self._artifacts.get(name, deployment.get("artifact")),
                    "replicas": desired,
                    "ready_replicas": ready,
                    "ready": bool(ready),
                }
            )
        return data

    async def _reload_route(self, send: Send) -> None:
        if self._reload is None:
            await send_error(send, ReloadUnavailable("no config file to reload"))
            return
        try:
            summary = await self._reload()
        except RequestError as error:
            await send_error(send, error)
            return
        await send_json(send, 200, summary)


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _method_not_allowed(send: Send, allowed: str) -> None:
    await send_error(send, MethodNotAllowed(f"use {allowed}", headers={"Allow": allowed}))
