"""The one error taxonomy of sr: every error sr raises on purpose is drawn here.

What a caller of sr can see (a command line, an HTTP caller, a program using the Python API)
is an `SrError`, defined in this module:

    SrError
    ├── UsageError            a command line that cannot be carried out (exit status 2)
    ├── ConfigError           a config that does not validate; carries every ConfigIssue
    ├── ArtifactNotFound      a model artifact that is not where sr looked
    ├── UnsupportedModel      a checkpoint sr can read but cannot serve faithfully
    ├── StartupFailed         a deployment can never become ready (names replica and reason)
    │   └── DownloadFailed    an artifact `sr serve --download` needed could not be fetched
    ├── ReloadFailed          a new config could not be brought up; the old one serves on
    └── RequestError          an answer to an HTTP caller: status + code + message
        ├── InvalidRequest    400 invalid_request
        │   └── EmptyInput    400 invalid_request; TEI's routes answer it as TEI's `Empty`
        ├── InvalidConfig     400 invalid_config (POST /api/v1/reload)
        ├── InvalidApiKey     401 invalid_api_key
        ├── Forbidden         403 forbidden (an Origin or Host the listener does not allow)
        ├── NotFound          404 not_found (no such route)
        ├── ModelNotFound     404 model_not_found
        ├── ReplicaNotFound   404 replica_not_found (POST /api/v1/faults)
        ├── MethodNotAllowed  405 method_not_allowed
        ├── HeadReadTimeout   408 request_timeout (request head not complete in time)
        ├── BodyReadTimeout   408 request_timeout (body not complete in time)
        ├── ReloadRejected    409 reload_failed (POST /api/v1/reload)
        │   ├── ReloadInProgress  409 reload_in_progress (one reload at a time)
        │   └── ReloadUnavailable 409 reload_unavailable (no config file to re-read)
        ├── RequestTooLarge   413 request_too_large
        ├── UnsupportedMediaType 415 unsupported_media_type (a POST body that is not JSON)
        ├── HeadersTooLarge   431 request_header_fields_too_large (request head or trailers)
        ├── ForwardFailed     500 worker_failed (inside a worker: a forward raised)
        ├── WorkerFailed      502 worker_failed
        ├── Overloaded        503 overloaded (with Retry-After)
        ├── Unavailable       503 unavailable
        ├── DeadlineExceeded  504 timeout
        └── VersionNotSupported 505 http_version_not_supported

    SrError (continued: the last section of this module)
    └── TransportError        an exchange with a worker gave no usable HTTP answer
        ├── ConnectFailed     no connection: the request never left the router
        ├── WriteFailed       the request was not written whole: no handler saw it
        └── ReadFailed        the request was written; its answer is missing or malformed

Beside the code that raises them live the signals between sr's own modules: each is caught
inside sr and becomes an SrError above, a fallback, a retry or an exit status, so no caller
of sr handles one, and keeping it beside the only code that raises and handles it keeps that
code readable on its own. None of them derives from SrError: a broad `except SrError` (the
CLI's one-line exit, the reloader's 409) must not swallow one by accident.

    sr.pool.state.IllegalTransition        a replica's lifecycle move its state table forbids:
                                           a bug in sr, never caught (an assertion with a name)
    sr.worker.state.IllegalTransition      the same for a worker's lifecycle
    sr.pool.forked.ForkServerError         the fork server could not fork a worker: the
                                           replica spawns it instead (sr.pool.replica)
    sr.pool.worker_access.AccessError      an attached replica's key or CA bundle is unusable:
                                           StartupFailed / ReloadFailed naming the field
    sr.worker.service.DeviceUnavailable    the accelerator asked for is absent: the worker's
                                           /health says `failed` with the reason
    sr.router.inventory_cli.InventoryUnavailable
                                           `sr inventory` got no inventory: exit status 1
    sr.router.inventory_cli.RouterAway     an InventoryUnavailable: the router is not
                                           answering now, so `--watch` waits and asks again
    sr.pool.views.InventoryShapeError      `sr inventory` read JSON that is not an inventory
                                           it can read (the field named): exit status 1
    sr.http.connection.ConnectionStateError
                                           a move the connection's state table forbids: a
                                           bug in its driver, never caught
    sr.http.driver.PeerGone                the peer closed the connection: stop serving it
    sr.http.body.ClientDisconnected        the caller hung up before its body arrived: no
                                           answer is written (sr.router.app)
    sr.http.sockio.SendTimeout             the peer did not read our answer in time (a
                                           trio.BrokenResourceError: the connection is dropped)
    sr.http.wire.InvalidAnswer             an answer that cannot be written as HTTP/1.1 (a
                                           bug in the app): a 500 instead, or the connection
                                           is dropped
    sr.http.asgi_adapter.LifespanFailed    the ASGI app reported that its startup failed: the
                                           server does not start

Bad arguments to a function (a caller's programming error, such as a thread count of 0)
raise Python's own ValueError or TypeError, as the standard library does; they are not part
of this taxonomy.

Workers and the router share the JSON body, OpenAI's error shape:
`{"error": {"code": ..., "message": ..., "type": ..., "param": ..., "request_id": ...}}`,
`request_id` present while a request is being answered (sr.request_id).

`type` is OpenAI's error class: "invalid_request_error" for every 4xx (OpenAI uses it for
401 and 404 too) and "server_error" for every 5xx. `param` names the request field the error
is about, or is null: passed explicitly, or else, for the classes that validate request
fields (InvalidRequest, RequestTooLarge), taken from the message, whose convention is to
start with the field's path ("input[1][3]: ...", "dimensions: ..."). ModelNotFound is
always about `model`.
"""

from __future__ import annotations

import json
import re

import attrs

from sr.answer import JSON_CONTENT_TYPE, Answer, HeadFields
from sr.request_id import current as current_request_id


class SrError(Exception):
    """Base of every error sr raises on purpose."""


class UsageError(SrError):
    """A command line that cannot be carried out. The CLI prints it as one line, exit 2."""


@attrs.frozen
class ConfigIssue:
    path: str  # e.g. "global.model_catalog.deployments.primary.replicas[1].device"
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(SrError):
    """A config that does not validate. Holds every issue found, not just the first."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        super().__init__("; ".join(str(i) for i in self.issues))


class ArtifactNotFound(SrError):
    """A model artifact that could not be resolved; the message lists where sr looked."""


class UnsupportedModel(SrError):
    """A checkpoint sr can read but does not know how to serve faithfully."""


class StartupFailed(SrError):
    """A deployment can never become ready, or readiness timed out. Names the deployment,
    the replica and the reason."""


class DownloadFailed(StartupFailed):
    """An artifact `sr serve --download` needed could not be fetched (one line)."""


class ReloadFailed(SrError):
    """The new config could not be brought up; the old one keeps serving."""


# A field path at the head of a message: `input`, `input[1]`, `input[0][3]`, `labels.a`,
# `questions.q.criteria.b`. Not `body` (the whole request is not a parameter).
_FIELD_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[^\s:\[\]]+)*): ")


def param_from_message(message: str) -> str | None:
    """The field path a validation message starts with ("input[1]: ..."), or None."""
    match = _FIELD_PREFIX.match(message)
    if match is None or match.group(1) == "body":
        return None
    return match.group(1)


class RequestError(SrError):
    status: int = 500
    code: str = "internal_error"
    # True for the classes whose messages start with the offending field's path.
    names_field: bool = False
    default_param: str | None = None

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None) -> None:
        """A subclass's status and code, given in its class line:
        `class NotFound(RequestError, status=404, code="not_found")`."""
        super().__init_subclass__()
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})
        if param is None:
            param = param_from_message(message) if self.names_field else self.default_param
        self.param = param

    @property
    def type(self) -> str:
        """OpenAI's error type: invalid_request_error for 4xx, server_error for 5xx."""
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def to_dict(self) -> dict[str, str | None]:
        answer = {
            "code": self.code,
            "message": self.message,
            "type": self.type,
            "param": self.param,
        }
        request_id = current_request_id.get()
        if request_id is not None:
            answer["request_id"] = request_id
        return answer

    def body(self) -> bytes:
        return json.dumps({"error": self.to_dict()}).encode()

    def header_fields(self) -> HeadFields:
        """The error's own headers (Retry-After, Allow, WWW-Authenticate) as an answer's
        head carries them: lower-case names, latin-1 bytes."""
        return [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in self.headers.items()
        ]

    def answer(self) -> Answer:
        """The error on the wire, whole: status, head (JSON, then `header_fields`) and body.
        The one writer of an error's answer, wherever sr answers one (the HTTP driver, the
        ASGI adapter, a worker's routes, the router's fronts); an ASGI app sends the same
        parts. Extra head fields (Allow, Retry-After, WWW-Authenticate) travel in the
        error's own `headers`."""
        return self.status, [JSON_CONTENT_TYPE, *self.header_fields()], self.body()


# Each class is one row: its status and code (`__init_subclass__`), what it is for when the
# name does not say it.
class InvalidRequest(RequestError, status=400, code="invalid_request"):
    names_field = True


class EmptyInput(InvalidRequest):
    """TEI's `Empty` (400): an empty batch, or a text with nothing in it (sr.router.tei)."""


class InvalidConfig(RequestError, status=400, code="invalid_config"): ...


class InvalidApiKey(RequestError, status=401, code="invalid_api_key"): ...


class Forbidden(RequestError, status=403, code="forbidden"): ...


class NotFound(RequestError, status=404, code="not_found"): ...


class ModelNotFound(RequestError, status=404, code="model_not_found"):
    default_param = "model"


class HeadReadTimeout(RequestError, status=408, code="request_timeout"): ...


class BodyReadTimeout(RequestError, status=408, code="request_timeout"): ...


class ReplicaNotFound(RequestError, status=404, code="replica_not_found"): ...


class MethodNotAllowed(RequestError, status=405, code="method_not_allowed"): ...


class ReloadRejected(RequestError, status=409, code="reload_failed"): ...


class ReloadInProgress(ReloadRejected, code="reload_in_progress"): ...


class ReloadUnavailable(ReloadRejected, code="reload_unavailable"): ...


class RequestTooLarge(RequestError, status=413, code="request_too_large"):
    names_field = True


class UnsupportedMediaType(RequestError, status=415, code="unsupported_media_type"): ...


class HeadersTooLarge(RequestError, status=431, code="request_header_fields_too_large"):
    """A request head (or trailers) over the cap (sr.http.limits); the connection closes."""


class ForwardFailed(RequestError, status=500, code="worker_failed"):
    """A forward raised on a worker's device thread; the worker keeps serving."""


class WorkerFailed(RequestError, status=502, code="worker_failed"): ...


class Overloaded(RequestError, status=503, code="overloaded"):
    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class Unavailable(RequestError, status=503, code="unavailable"): ...


class DeadlineExceeded(RequestError, status=504, code="timeout"): ...


class VersionNotSupported(RequestError, status=505, code="http_version_not_supported"):
    """A request line naming an HTTP version other than 1.0 and 1.1 (0.9, 2.0, ...)."""


# -- transport failures, by phase --------------------------------------------------------
# The phase says whether the worker may have acted on the request (`reached_worker`), which
# is what a retry has to know: sr.http.client writes a request again on a fresh connection
# only when it cannot have reached the worker, and sr.pool.outcome maps every one of them
# to a pool outcome and to the caller's WorkerFailed in one place.


class TransportError(SrError):
    """The exchange with a worker produced no usable HTTP answer (refused, reset, closed,
    malformed). Raised as one of the phase classes below; fakes in tests may raise it bare."""

    reached_worker: bool = True  # unknown phase: assume the worker may have acted


class ConnectFailed(TransportError):
    """No connection to the worker could be had; nothing was sent."""

    reached_worker = False


class WriteFailed(TransportError):
    """The request could not be written whole (or not at all): no handler saw it."""

    reached_worker = False


class ReadFailed(TransportError):
    """The request was written in full; the answer is missing, cut short or malformed.
    The worker may have acted on the request."""

    reached_worker = True
