"""The one error taxonomy of sr.

    SrError
    ├── UsageError            a command line that cannot be carried out (exit status 2)
    ├── ConfigError           a config that does not validate; carries every ConfigIssue
    ├── ArtifactNotFound      a model artifact that is not where sr looked
    └── RequestError          an answer to an HTTP caller: status + code + message
        ├── InvalidRequest    400 invalid_request
        ├── InvalidApiKey     401 invalid_api_key
        ├── ModelNotFound     404 model_not_found
        ├── BodyReadTimeout   408 request_timeout (body not complete in time)
        ├── RequestTooLarge   413 request_too_large
        ├── WorkerFailed      502 worker_failed
        ├── Overloaded        503 overloaded (with Retry-After)
        ├── Unavailable       503 unavailable
        └── DeadlineExceeded  504 timeout

Workers and the router share the JSON body `{"error": {"code": ..., "message": ...}}`.
"""

from __future__ import annotations

import json

import attrs


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


class RequestError(SrError):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return json.dumps({"error": {"code": self.code, "message": self.message}}).encode()


class InvalidRequest(RequestError):
    status, code = 400, "invalid_request"


class InvalidApiKey(RequestError):
    status, code = 401, "invalid_api_key"


class ModelNotFound(RequestError):
    status, code = 404, "model_not_found"


class BodyReadTimeout(RequestError):
    status, code = 408, "request_timeout"


class RequestTooLarge(RequestError):
    status, code = 413, "request_too_large"


class WorkerFailed(RequestError):
    status, code = 502, "worker_failed"


class Overloaded(RequestError):
    status, code = 503, "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class Unavailable(RequestError):
    status, code = 503, "unavailable"


class DeadlineExceeded(RequestError):
    status, code = 504, "timeout"
