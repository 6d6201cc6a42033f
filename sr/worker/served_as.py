"""The names a worker answers to, and the one place a request's `model` is settled.

A request may name a deployment or its artifact in `model`; the answer names what the
request named. The router forwards the caller's bytes and passes the worker's answer back
untouched, so it tells the worker, in the `x-sr-deployment` header, which deployment it
serves the request for; the worker accepts that name beside its artifact and refuses any
other (answering for a model it does not serve would be a silent lie). Before, the router
renamed `model` in the request and again in the answer, by splicing bytes.

The header is not an authority: whoever can reach the worker can already have it answer,
and the name only chooses which of two true names the answer carries.
"""

from __future__ import annotations

import re
from contextvars import ContextVar

from sr.errors import ModelNotFound

HEADER = b"x-sr-deployment"
# A deployment name (sr.config.validate.DEPLOYMENT_NAME_RE); other values are ignored, as
# a direct caller's odd request id is.
_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Set by WorkerService.handle while it answers a request (the request id's pattern).
current_deployment: ContextVar[str | None] = ContextVar("sr_deployment", default=None)


def deployment_of(value: bytes) -> str | None:
    """The header's value as a deployment name, or None when it cannot be one."""
    return value.decode("ascii") if _NAME.fullmatch(value) else None


def served_model(named: str | None, artifact: str) -> str:
    """The model an answer names: `named` (the request's `model`) when it is this worker's
    artifact (a trailing slash does not count, as in the pool's card check) or the
    deployment the router serves this request for; the artifact when the request names
    none. ModelNotFound otherwise."""
    if named is None:
        return artifact
    if named.rstrip("/") == artifact.rstrip("/") or named == current_deployment.get():
        return named
    deployment = current_deployment.get()
    serves = f"{artifact!r}" + (f" as deployment {deployment!r}" if deployment else "")
    raise ModelNotFound(f"model: {named!r} is not served here; this worker serves {serves}")
