"""The router's HTTP front end: one plain ASGI callable.

Native routes parse the JSON body once, check `model`, pick the deployment, and hand the
caller's bytes to the pool (`Supervisor.request_raw`) untouched; the worker's answer comes
back as bytes, untouched too (the worker settles `model`: sr.worker.served_as).
The pool's typed errors become the wire errors of `sr.errors`; a worker's own 4xx passes
through.
TEI's routes (sr.router.tei) take the same path through another front (sr.router.front):
only the body they read and the shapes they answer in differ.
Everything else here is a small read-only view (health, readiness, inventory, metrics,
the OpenAPI document) or the reload trigger.

Routing is one table, path -> method -> handler (`_routes`, and `_prefix_routes` for
`/v1/models/{model}`): a path it does not hold is 404, a method its path does not take is
405 with `Allow` naming the ones it does; HEAD is taken wherever GET is. The fault route is
in the table only when fault injection is on (sr.router.faults). Every route also answers
under `/d/<deployment>/` for that deployment alone: the prefix is cut off before the table
is read (one `startswith` per request) and kept in the scope, where the dispatching routes
find it, as they find `?model=`: the address of clients that never send `model`.

Around every request (`_http`): its id (sr.request_id: the caller's `X-Request-Id` or a
new one) is current while it is answered and echoed on the answer; CORS (sr.router.cors,
opt-in per listener) answers preflights before the API key check and marks answers to
allowed origins; the access log (sr.logs.AccessLog, opt-in) gets one line once the
answer is sent. With traces on (sr.router.tracing), a route that dispatches to a worker
gets a server span, and the pool its spans under it; with them off, one None check.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

import trio

from sr import __version__, request_id
from sr.config.schema import SrConfig
from sr.errors import (
    Forbidden,
    InvalidApiKey,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    ReloadUnavailable,
    RequestError,
    Unavailable,
)
from sr.http.asgi import (
    BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    ClientDisconnected,
    Receive,
    Send,
    read_body,
    request_headers,
    send_answer,
    send_error,
    send_json,
    send_response,
    serve_lifespan,
)
from sr.http.hang_up import EXTENSION as HANG_UP_EXTENSION
from sr.logs import AccessLog
from sr.pool.views import Inventory, inventory_json, startup_status_json
from sr.router import openapi_doc, tei, tei_info
from sr.router.auth import ApiKeyCheck
from sr.router.cache import ResultCache, cache_key
from sr.router.cors import CorsPolicy
from sr.router.faults import FAULTS_PATH, FaultRoute, WorkerPoster, disabled_fault_route
from sr.router.front import Front, NativeFront
from sr.router.guard import FrontDoorGuard, check_json_body
from sr.router.metrics import METRICS_CONTENT_TYPE, RouterMetrics
from sr.router.replica_metrics import REPLICA_SCRAPE_TIMEOUT_S
from sr.worker.timing import WorkerTiming

if TYPE_CHECKING:
    from sr.pool.deployment import HangUpWatch, Reply
    from sr.pool.dispatch_trace import DispatchTrace
    from sr.router.tracing import RequestTrace, RouterTracing

NATIVE_ROUTES = frozenset(
    {
        "/v1/embeddings", "/v1/classify", "/v1/decisions", "/v1/rerank", "/v1/tokenize",
        "/v1/token_embeddings", "/v1/detokenize", "/v1/sparse_embeddings",
    }
)  # fmt: skip
# Other APIs' paths for a native route, the body and answer the same: Cohere's v2 rerank,
# Infinity's embeddings.
ALIAS_ROUTES = {"/v2/rerank": "/v1/rerank", "/embeddings": "/v1/embeddings"}
# The worker route every rerank body goes to (TEI's /rerank and Cohere v2's included).
_RERANK_ROUTE = "/v1/rerank"
MODEL_ROUTE_PREFIX = "/v1/models/"  # GET /v1/models/{model}
# A deployment's own base URL: /d/<deployment>/<route> is <route> for that deployment, so a
# client that never sends `model` (TEI's, Cohere's) can be pointed at one of several.
DEPLOYMENT_PATH_PREFIX = "/d/"
# The deployment the URL names (/d/<name>/), kept in the ASGI scope for the handlers.
ADDRESSED_SCOPE_KEY = "sr.addressed"
TIMEOUT_HEADER = b"x-request-timeout-ms"
REPLICA_HEADER = b"x-sr-replica"
OPENAPI_PATH = "/openapi.json"
# The deployment a request resolved to, kept in its ASGI scope for the access log.
DEPLOYMENT_SCOPE_KEY = "sr.deployment"
TOKENS_SCOPE_KEY = "sr.tokens"  # the tokens a worker computed for the request
_OUTCOME_BY_CODE = {
    "overloaded": "overloaded",
    "unavailable": "unavailable",
    "timeout": "timeout",
    "worker_failed": "failed",
    "internal_error": "failed",
}
_log = logging.getLogger("sr.events")
# A route's handler; the table maps a path to {method: handler} (module docstring).
Handler = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


class SupervisorLike(WorkerPoster, Protocol):
    """The part of sr.pool's Supervisor the front end uses (`post_to_worker`: the fault
    route's)."""

    def resolve(self, model: str) -> str: ...
    async def request_raw(
        self,
        deployment: str,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        request_id: str | None = None,
        watch: HangUpWatch | None = None,
        trace: DispatchTrace | None = None,
    ) -> Reply: ...
    def inventory(self) -> Inventory: ...
    def is_ready(self) -> bool: ...
    def model_card(self, deployment: str) -> dict[str, Any] | None: ...
    async def replica_metrics(self, timeout_s: float) -> list[Any]: ...


# An hour: longer than any forward, short enough for every clock and deadline sum.
MAX_REQUEST_TIMEOUT_MS = 3_600_000
_TIMEOUT_DIGITS = len(str(MAX_REQUEST_TIMEOUT_MS))
# A worker's answer over this size that a front rewrites (TEI's shapes: about 25 ms a MiB on
# a 2-core host) is rewritten on a helper thread, so the event loop goes on serving the
# other requests; a smaller one inline, without a thread's hand-off.
_INLINE_REWRITE_BYTES = 1 << 20


def parse_timeout_header(value: bytes | None) -> float | None:
    """X-Request-Timeout-Ms as seconds; an integer in 1..MAX_REQUEST_TIMEOUT_MS or
    InvalidRequest (its length is checked before it is converted: Python refuses, or takes
    quadratic time over, integers of thousands of digits)."""
    if value is None:
        return None
    text = value.strip()
    if (
        not text.isdigit()
        or len(text) > _TIMEOUT_DIGITS
        or not 0 < int(text) <= MAX_REQUEST_TIMEOUT_MS
    ):
        raise InvalidRequest(
            "X-Request-Timeout-Ms: must be an integer number of milliseconds from 1 to "
            f"{MAX_REQUEST_TIMEOUT_MS}",
            param="X-Request-Timeout-Ms",
        )
    return int(text) / 1000.0


class RouterApp:
    def __init__(
        self,
        core: SupervisorLike,
        config: SrConfig,
        *,
        metrics: RouterMetrics,
        cache: ResultCache,
        reload: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout_s: float = BODY_READ_TIMEOUT_S,
        fault_injection: bool = False,  # SR_FAULT_INJECTION=1 (sr.settings)
        access_log: AccessLog | None = None,
        tracing: RouterTracing | None = None,
    ):
        self.core = core
        self.tracing = tracing  # None: traces off (sr.router.tracing)
        self.access_log = access_log or AccessLog(enabled=False)
        # OpenAI's model objects carry `created`: when this router started serving.
        self._created = int(time.time())
        self.metrics = metrics
        self.cache = cache
        self._reload = reload
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._artifacts: dict[str, str] = {}
        self._auth = ApiKeyCheck([])
        self._cors = CorsPolicy()
        self._guard = FrontDoorGuard("127.0.0.1")
        self.apply_config(config)
        # POST routes that dispatch to a worker: sr's own and TEI's (sr.router.tei).
        fronts: list[Front] = [NativeFront(route) for route in sorted(NATIVE_ROUTES)]
        fronts += [NativeFront(alias, native) for alias, native in sorted(ALIAS_ROUTES.items())]
        # TEI's root route reads the task of a body with `inputs` off the deployment's card.
        fronts += [tei.TeiFront(route, self._head_task) for route in sorted(tei.POST_ROUTES)]
        routes: list[tuple[str, dict[str, Handler]]] = [
            *((front.route, {"POST": functools.partial(self._native, front)}) for front in fronts),
            ("/health", {"GET": self._health}),
            ("/ready", {"GET": self._ready}),
            ("/startup-status", {"GET": self._startup_status}),
            ("/v1/models", {"GET": self._models}),
            ("/api/v1/inventory/model-runtime", {"GET": self._inventory}),
            ("/metrics", {"GET": self._metrics}),
            (OPENAPI_PATH, {"GET": self._openapi}),
            (tei_info.INFO_PATH, {"GET": self._tei_info}),
            ("/api/v1/reload", {"POST": self._reload_route}),
        ]
        self._fault_injection = fault_injection
        if fault_injection:
            routes.append((FAULTS_PATH, {"POST": FaultRoute(core)}))
        self._routes = _route_table(routes)
        self._prefix_routes: tuple[tuple[str, dict[str, Handler]], ...] = (
            (MODEL_ROUTE_PREFIX, {"GET": self._model}),
        )

    def apply_config(self, config: SrConfig) -> None:
        """Adopt a (re)loaded config: artifacts, API keys, CORS origins, which deployments
        cache."""
        deployments = config.deployments
        self._artifacts = {name: d.artifact for name, d in deployments.items()}
        self._revisions = {name: d.revision for name, d in deployments.items()}
        listener = config.listeners[0] if config.listeners else None
        self._auth = ApiKeyCheck(list(listener.api_keys) if listener else [])
        self._cors = CorsPolicy(listener.cors_allow_origins if listener else ())
        self._guard = FrontDoorGuard(
            listener.host if listener else "127.0.0.1", listener.allowed_hosts if listener else ()
        )
        # A discovered fleet (no fixed count) is never a single worker: no cache.
        self.cache.configure({name: d.fixed_worker_count or 0 for name, d in deployments.items()})

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
        started = time.perf_counter()
        authorization, sent_id, origin, host, content_type = request_headers(
            scope, b"authorization", request_id.HEADER, b"origin", b"host", b"content-type"
        )
        rid = request_id.usable(sent_id) if sent_id is not None else None
        token = request_id.current.set(rid or request_id.new_request_id())
        answer = _Answer(send, request_id.current.get(), self._cors.answer_headers(origin))
        try:
            if sent_id is not None and rid is None:
                await send_error(answer, InvalidRequest(_BAD_REQUEST_ID, param="X-Request-Id"))
            else:
                # sr.router.guard: no web page may drive the router (Host, Origin, body type)
                self._guard.check_host(host)
                if scope["method"] == "POST":
                    check_json_body(content_type)
                await self._route(scope, receive, answer, authorization, origin, host)
        except RequestError as error:
            await send_error(answer, error)
        finally:
            request_id.current.reset(token)
            if self.access_log.enabled:
                self.access_log.record(
                    request_id=answer.request_id.decode(),
                    method=scope["method"],
                    route=scope.get("root_path", "") + scope["path"],
                    deployment=scope.get(DEPLOYMENT_SCOPE_KEY),
                    replica=answer.replica,
                    status=answer.status,
                    ms=(time.perf_counter() - started) * 1000.0,
                    tokens=scope.get(TOKENS_SCOPE_KEY),
                )

    async def _route(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        authorization: bytes | None,
        origin: bytes | None,
        host: bytes | None,
    ) -> None:
        path = scope["path"]
        if path.startswith(DEPLOYMENT_PATH_PREFIX):
            path = _strip_deployment(scope, path)
        method = scope["method"]
        if origin is not None:
            if method == "OPTIONS" and self._cors.enabled:
                (asked,) = request_headers(scope, b"access-control-request-method")
                if self._cors.is_preflight(method, origin, asked):
                    await self._preflight(scope, send, origin)
                    return
            self._guard.check_origin(origin, self._cors.enabled and self._cors.allows(origin), host)
        if not self._auth.allows(path, authorization):
            error = InvalidApiKey("missing or invalid API key (Authorization: Bearer <key>)")
            error.headers["WWW-Authenticate"] = "Bearer"
            await send_error(send, error)
            return
        try:
            methods = self._routes.get(path) or self._prefixed(path)
            if methods is None:
                await send_error(send, _no_route(path))
                return
            handler = methods.get("GET" if method == "HEAD" else method)
            if handler is None:
                allowed = ", ".join(methods)
                await send_error(
                    send, MethodNotAllowed(f"use {allowed}", headers={"Allow": allowed})
                )
                return
            await handler(scope, receive, send)
        except Exception as error:  # a bug must cost one 500, never the connection
            _log.exception("router_internal_error path=%s", path)
            await send_error(send, RequestError(type(error).__name__))

    def _prefixed(self, path: str) -> dict[str, Handler] | None:
        """The methods of the first prefix route `path` falls under, or None."""
        for prefix, methods in self._prefix_routes:
            if path.startswith(prefix):
                return methods
        return None

    async def _native(self, front: Front, scope: dict[str, Any], receive: Receive, send: Send):
        """Every route that dispatches to a worker, native or TEI: the front reads the body
        and shapes answers and errors (sr.router.front); the rest is the same for all."""
        route = front.route
        started = time.perf_counter()
        deployment = ""
        outcome = "rejected"
        trace = None if self.tracing is None else self.tracing.begin(
            scope, route, request_id.current.get())  # fmt: skip
        try:
            content_length, timeout_value = request_headers(
                scope, b"content-length", TIMEOUT_HEADER
            )
            timeout_s = parse_timeout_header(timeout_value)
            raw = await read_body(
                receive, content_length, self.max_body_bytes, self.body_timeout_s,
                scope.get("extensions"),
            )  # fmt: skip
            addressed = self._addressed(scope)
            request = front.parse(raw, addressed)
            deployment = self._deployment_for(request.model, addressed, request.route)
            scope[DEPLOYMENT_SCOPE_KEY] = deployment
            key = None
            if self.cache.enabled_for(deployment):
                key = cache_key(request.route, request.body)
                cached = self.cache.get(deployment, key)
                if cached is not None:
                    outcome = "cached"
                    self.metrics.cache_hits.labels(deployment).inc()
                    if len(cached) > _INLINE_REWRITE_BYTES and front.rewrites_answers:
                        answer = await trio.to_thread.run_sync(front.answer, request, cached)
                    else:
                        answer = front.answer(request, cached)
                    await send_response(send, 200, answer, [(REPLICA_HEADER, b"cache")])
                    return
            forward = front.forward(request, raw)
            reply = await self._dispatch(
                scope, receive, deployment, request.route, forward, timeout_s, trace
            )
            if reply is None:
                outcome = "canceled"
                return
            status, answer = reply.status, reply.body
            if key is not None:
                self.cache.put(deployment, key, status, answer)
            headers = [(REPLICA_HEADER, str(reply.replica_id).encode())]
            if 200 <= status < 300:
                outcome = "ok"
                if len(answer) > _INLINE_REWRITE_BYTES and front.rewrites_answers:
                    answer = await trio.to_thread.run_sync(front.answer, request, answer)
                else:
                    answer = front.answer(request, answer)
                timing = WorkerTiming.read(reply.headers)  # sr.worker.timing
                if timing is not None:
                    self.metrics.observe_reply(deployment, route, timing)
                    scope[TOKENS_SCOPE_KEY] = timing.tokens
                    headers += front.timing_headers(timing)
            else:
                status, answer = front.worker_error(request, status, answer)
            await send_response(send, status, answer, headers)
        except RequestError as error:
            outcome = _OUTCOME_BY_CODE.get(error.code, "rejected")
            await send_answer(send, front.error(error))
        except ClientDisconnected:
            outcome = "canceled"
        finally:
            self.metrics.observe_request(deployment, route, outcome, time.perf_counter() - started)
            if trace is not None:
                trace.end(deployment, outcome, getattr(send, "status", 0))

    def _addressed(self, scope: dict[str, Any]) -> str | None:
        """The deployment the URL addresses (`/d/<name>/` or `?model=`), None when it names
        none. Both given, they must name the same deployment."""
        named = scope.get(ADDRESSED_SCOPE_KEY)
        query = scope.get("query_string")
        if not query and named is None:
            return None  # the usual request: nothing to read
        addressed = None if named is None else self.core.resolve(named)
        queried = query_model(query) if query else None
        if queried is not None:
            deployment = self.core.resolve(queried)
            if addressed is not None and deployment != addressed:
                raise InvalidRequest(
                    f"model: ?model={queried} names deployment {deployment!r}; the URL "
                    f"addresses {addressed!r}"
                )
            addressed = deployment
        return addressed

    def _deployment_for(
        self, model: str | None, addressed: str | None = None, route: str = ""
    ) -> str:
        """The deployment a request names: its body's `model`, the URL's (`addressed`), or
        (TEI bodies name none) the only one, or for a rerank body the only reranker. A body
        and a URL that disagree are refused."""
        if addressed is not None:
            if model is not None and self.core.resolve(model) != addressed:
                raise InvalidRequest(
                    f"model: {model!r} is not deployment {addressed!r}, which the URL addresses"
                )
            return addressed
        if model is not None:
            return self.core.resolve(model)
        if len(self._artifacts) == 1:
            return next(iter(self._artifacts))
        reranker = self._only_reranker() if route == _RERANK_ROUTE else None
        if reranker is not None:
            return reranker
        raise InvalidRequest(
            "model: required when several deployments are served; name one of: "
            + ", ".join(sorted(self._artifacts))
            + f" (in the body, as ?model=, or with the URL {DEPLOYMENT_PATH_PREFIX}<deployment>/)"
        )

    def _only_reranker(self) -> str | None:
        """The one deployment able to rerank (a cross-encoder), when a replica of every
        deployment is ready and exactly one is (sr.router.openapi_doc's rule, which the
        served document states). Rerank clients that cannot address a deployment (some
        post to the root's /rerank whatever their URL's path) then reach it; a deployment
        that cannot rerank would only refuse the body."""
        return openapi_doc.only_reranker(
            openapi_doc.served_deployment(name, artifact, self.core.model_card(name), None)
            for name, artifact in self._artifacts.items()
        )

    def _head_task(self, model: str | None) -> str | None:
        """The head the deployment a request names serves (a ready replica's card
        `head_task`: "sequence", "token" or None), None while no replica is ready; a model
        that names no deployment is None here and refused by the dispatch."""
        try:
            card = self.core.model_card(self._deployment_for(model))
        except RequestError:
            return None
        return card.get("head_task") if card else None

    async def _tei_info(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """GET /info: TEI's info object for the deployment (sr.router.tei_info)."""
        try:
            deployment = self._deployment_for(None, self._addressed(scope))
            card = self.core.model_card(deployment)
            if card is None:
                raise Unavailable(f"deployment {deployment!r} has no ready replica yet")
            entries = self._model_entries()
            ready = next((e["ready_replicas"] for e in entries if e["id"] == deployment), 0)
            answer = tei_info.info(
                card, deployment=deployment, ready_replicas=ready, version=__version__
            )
        except RequestError as error:
            await send_answer(send, tei.error_reply(error))
            return
        await send_json(send, 200, answer)

    async def _dispatch(
        self,
        scope: dict[str, Any],
        receive: Receive,
        deployment: str,
        route: str,
        body: bytes,
        timeout_s: float | None,
        trace: RequestTrace | None = None,
    ) -> Reply | None:
        """request_raw, cancelled if the caller hangs up first (the pool counts `canceled`);
        None when it was. Under sr's server the hang-up is noticed by its poller (the
        `sr.hang_up` extension, sr.http.hang_up), which the pool points at the cancel scope
        each attempt already has; elsewhere by a watcher task. `trace`: the request's spans,
        when traces are on (the pool adds its own under them)."""
        hang_up = scope.get("extensions", {}).get(HANG_UP_EXTENSION)
        rid = request_id.current.get()
        spans = trace.dispatch if trace is not None else None
        if hang_up is None:
            return await _dispatch_watching_receive(
                receive,
                lambda: self.core.request_raw(
                    deployment, route, body, timeout_s=timeout_s, request_id=rid, trace=spans
                ),
            )
        try:
            return await self.core.request_raw(
                deployment,
                route,
                body,
                timeout_s=timeout_s,
                request_id=rid,
                watch=hang_up["watch"],
                trace=spans,
            )
        except ClientDisconnected:
            return None  # the caller hung up

    async def _health(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    async def _ready(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.core.is_ready():
            await send_json(send, 200, {"status": "ready"})
        else:
            await send_json(send, 503, {"status": "not_ready"})

    async def _startup_status(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, startup_status_json(self.core.inventory()))

    async def _inventory(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        data = inventory_json(self.core.inventory())
        for name, deployment in data["deployments"].items():
            deployment["base_path"] = deployment_base_path(name)  # for a model-less client
        await send_json(send, 200, data)

    async def _metrics(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        scrapes = await self.core.replica_metrics(REPLICA_SCRAPE_TIMEOUT_S)
        text = self.metrics.render(scrapes)
        await send_response(send, 200, text, content_type=METRICS_CONTENT_TYPE)

    def _card_or_none(self, deployment: str) -> dict[str, Any] | None:
        """A ready replica's card; None while there is none, or while a reload's new
        deployment has no pool yet (the document then states no limits for it)."""
        try:
            return self.core.model_card(deployment)
        except RequestError:
            return None

    def _vocab_size(self, deployment: str) -> int | None:
        return openapi_doc.vocab_size(self._artifacts[deployment], self._revisions[deployment])

    async def _openapi(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        deployments = tuple(
            openapi_doc.served_deployment(
                name, artifact, self._card_or_none(name), self._vocab_size(name)
            )
            for name, artifact in sorted(self._artifacts.items())
        )
        document = openapi_doc.document_json(
            api_keys=self._auth.enabled,
            fault_injection=self._fault_injection,
            deployments=deployments,
        )
        await send_response(send, 200, document)

    async def _preflight(self, scope: dict[str, Any], send: Send, origin: bytes) -> None:
        """A CORS preflight: 204 with what the origin may send, or 403 naming it."""
        if not self._cors.allows(origin):
            await send_error(send, Forbidden(f"Origin: {origin.decode('latin-1')} is not allowed"))
            return
        (asked_headers,) = request_headers(scope, b"access-control-request-headers")
        headers = self._cors.preflight_headers(asked_headers)
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _models(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"object": "list", "data": self._model_entries()})

    async def _model(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """GET /v1/models/{name}: the deployment's entry of GET /v1/models. `name` is a
        deployment or its artifact, as in a request's `model` (artifacts may hold `/`)."""
        name = scope["path"][len(MODEL_ROUTE_PREFIX) :]
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
        for name, deployment in self.core.inventory().deployments.items():
            entry = {
                "id": name,
                "object": "model",
                "created": self._created,
                "owned_by": "sr",
                "artifact": self._artifacts.get(name, deployment.artifact),
                "replicas": deployment.desired_replicas,
                "ready_replicas": deployment.ready_replicas,
                "ready": bool(deployment.ready_replicas),
                "base_path": deployment_base_path(name),
            }
            card = self.core.model_card(name) or {}
            # A LoRA adapter deployment names its adapter and base (a ready worker's card).
            if card.get("adapter"):
                entry["adapter"] = card["adapter"]
            # The prompts `prompt_name` names; a sparse encoder's SpladePooling.
            for key in ("prompts", "sparse"):
                if card.get(key):
                    entry[key] = card[key]
            data.append(entry)
        return data

    async def _reload_route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self._reload is None:
            await send_error(send, ReloadUnavailable("no config file to reload"))
            return
        try:
            summary = await self._reload()
        except RequestError as error:
            await send_error(send, error)
            return
        await send_json(send, 200, summary)


_BAD_REQUEST_ID = "X-Request-Id: must be 1 to 128 visible ASCII characters"


class _Answer:
    """The `send` of one request: adds its id and CORS headers to the answer's head, and
    keeps what the access log reports (status, replica)."""

    __slots__ = ("_send", "extra", "replica", "request_id", "status")

    def __init__(self, send: Send, rid: str | None, cors: list[tuple[bytes, bytes]]) -> None:
        self._send = send
        self.request_id = (rid or "").encode()
        self.extra = [(request_id.HEADER, self.request_id), *cors]
        self.status = 0  # none sent: the caller hung up first
        self.replica: str | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = message.get("headers") or []
            for name, value in headers:
                if name == REPLICA_HEADER:
                    self.replica = value.decode("latin-1")
            message = {**message, "headers": [*headers, *self.extra]}
        await self._send(message)


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def deployment_base_path(deployment: str) -> str:
    """The path under which every route answers for `deployment` alone."""
    return f"{DEPLOYMENT_PATH_PREFIX}{deployment}/"


def _strip_deployment(scope: dict[str, Any], path: str) -> str:
    """`/d/<name>/<route>` -> `/<route>`, `<name>` kept in the scope (resolved, and refused
    when unknown, by the handler that dispatches, in its API's error shape)."""
    name, _, rest = path[len(DEPLOYMENT_PATH_PREFIX) :].partition("/")
    scope[ADDRESSED_SCOPE_KEY] = name
    # As a mounted ASGI app sees it: the handlers read the route's own path.
    scope["root_path"] = scope.get("root_path", "") + DEPLOYMENT_PATH_PREFIX + name
    scope["path"] = "/" + rest
    return scope["path"]


def query_model(query_string: bytes) -> str | None:
    """`?model=` of a request (a body's `model` for a client that sends none), or None."""
    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("model")
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest("model: give the query parameter once")
    if not values[0]:
        raise InvalidRequest("model: the query parameter must not be empty")
    return values[0]


def _route_table(routes: list[tuple[str, dict[str, Handler]]]) -> dict[str, dict[str, Handler]]:
    table: dict[str, dict[str, Handler]] = {}
    for path, methods in routes:
        if path in table:
            raise ValueError(f"two routes for {path}")
        table[path] = methods
    return table


def _no_route(path: str) -> NotFound:
    # The fault route is absent unless fault injection is on; its 404 says how to turn it on.
    return disabled_fault_route() if path == FAULTS_PATH else NotFound(f"no route {path}")


async def _dispatch_watching_receive(
    receive: Receive, request: Callable[[], Awaitable[Reply]]
) -> Reply | None:
    """`request()` under an ASGI server without the hang-up extension (and the in-memory
    test client): a watcher task in a nursery of its own, waiting in `receive()`, cancels
    it when the caller hangs up; None when it did."""
    reply = None
    failure: RequestError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
        try:
            reply = await request()
        except RequestError as error:  # raised here, not wrapped in the nursery's group
            failure = error
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return reply
