"""`POST /api/v1/faults`: set a fault on one replica's worker, for chaos tests.

Body: `{"deployment": name, "replica": <replica id or 0-based index>, "mode":
"none|hang|slow|fail|exit", "slow_ms": N}`. The router forwards `{mode, slow_ms}` to that
replica's worker (`POST /admin/faults`, sr.worker.faults) over the pool's own transport, so
the fault lands on exactly the process the pool dispatches to.

The route exists only when the router process was started with `SR_FAULT_INJECTION=1`
(its managed workers inherit the variable and serve `/admin/faults`); otherwise it answers
404 like any unknown path, so a production router does not even reveal it. It sits behind
the listener's API keys like every other route.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from sr.error_answer import read_error_answer
from sr.errors import (
    DeadlineExceeded,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    ReplicaNotFound,
    RequestError,
    Unavailable,
    WorkerFailed,
)
from sr.http.asgi import Receive, Send, read_body, request_headers, send_error, send_json
from sr.http.jsonbody import parse_json_object
from sr.worker.faults import fault_of
from sr.worker.validation import check_fields

FAULTS_PATH = "/api/v1/faults"
ENV_FLAG = "SR_FAULT_INJECTION"
WORKER_FAULTS_PATH = "/admin/faults"
MAX_FAULT_BODY_BYTES = 4096  # the body is four small fields
FORWARD_TIMEOUT_S = 5.0  # a stopped (SIGSTOP) worker must not hold the caller forever
_FIELDS = frozenset({"deployment", "replica", "mode", "slow_ms"})


def fault_injection_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(ENV_FLAG) == "1"


@attrs.frozen
class FaultRequest:
    deployment: str
    replica: str | int
    mode: str
    slow_ms: int = 0

    def worker_body(self) -> bytes:
        return json.dumps({"mode": self.mode, "slow_ms": self.slow_ms}).encode()


def parse_fault_request(raw: bytes) -> FaultRequest:
    """The validated request; InvalidRequest naming the offending field."""
    body = parse_json_object(raw)
    check_fields(body, allowed=_FIELDS, required=("deployment", "replica", "mode"))
    deployment, replica = body["deployment"], body["replica"]
    if not isinstance(deployment, str) or not deployment:
        raise InvalidRequest("deployment: expected a non-empty string")
    if isinstance(replica, bool) or not isinstance(replica, str | int):
        raise InvalidRequest("replica: expected a replica id (string) or index (integer)")
    if isinstance(replica, int) and replica < 0:
        raise InvalidRequest("replica: an index must be >= 0")
    mode, slow_ms = fault_of(body)
    return FaultRequest(deployment, replica, mode, slow_ms)


class _Transport(Protocol):
    async def exchange(
        self, method: str, path: str, body: bytes = b"", *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], bytes]: ...


def locate_replica(core: Any, deployment: str, replica: str | int) -> tuple[str, Any]:
    """(replica id, runner) of a published replica of `deployment`, by id or index.

    `core` is a Supervisor: `pools[name].runners` maps replica ids, in declared order, to
    the ReplicaRunner that owns the worker (`transport`, `record.pid`)."""
    pool = core.pools.get(deployment)
    if pool is None:
        known = sorted(core.pools)
        raise ModelNotFound(f"deployment {deployment!r} does not exist; known: {known}")
    ids = list(pool.runners)
    if isinstance(replica, int):
        if replica >= len(ids):
            raise ReplicaNotFound(
                f"replica: index {replica} is out of range; {deployment!r} has {len(ids)}"
            )
        replica_id = ids[replica]
    elif replica in pool.runners:
        replica_id = replica
    else:
        raise ReplicaNotFound(f"replica: {replica!r} is not a replica of {deployment!r}: {ids}")
    return replica_id, pool.runners[replica_id]


class FaultRoute:
    """The ASGI handler of `FAULTS_PATH` (the app routes that path here)."""

    def __init__(self, core: Any, *, enabled: bool) -> None:
        self.core = core
        self.enabled = enabled

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            if not self.enabled:
                raise NotFound(
                    f"no route {FAULTS_PATH} (start the router with {ENV_FLAG}=1 to enable it)"
                )
            if scope["method"] != "POST":
                raise MethodNotAllowed("use POST", headers={"Allow": "POST"})
            (content_length,) = request_headers(scope, b"content-length")
            raw = await read_body(receive, content_length, MAX_FAULT_BODY_BYTES)
            answer = await self.apply(parse_fault_request(raw))
        except RequestError as error:
            await send_error(send, error)
            return
        await send_json(send, 200, answer)

    async def apply(self, request: FaultRequest) -> dict[str, Any]:
        """Forward the fault to the worker; its answer (the fault card) comes back."""
        replica_id, runner = locate_replica(self.core, request.deployment, request.replica)
        transport: _Transport | None = runner.transport
        if transport is None:
            raise Unavailable(f"replica {replica_id} has no running worker to configure")
        pid = runner.record.pid
        with trio.move_on_after(FORWARD_TIMEOUT_S):
            try:
                status, _, payload = await transport.exchange(
                    "POST", WORKER_FAULTS_PATH, request.worker_body()
                )
            except Exception as error:  # TransportError or anything the socket throws
                raise WorkerFailed(f"replica {replica_id}: {type(error).__name__}") from None
            return _answer(replica_id, pid, status, payload)
        raise DeadlineExceeded(
            f"replica {replica_id} did not answer {WORKER_FAULTS_PATH} within "
            f"{FORWARD_TIMEOUT_S:g}s"
        )


def _answer(replica_id: str, pid: int | None, status: int, payload: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if status == 200 and isinstance(parsed, dict):
        return {"replica": replica_id, "pid": pid, "fault": parsed}
    message = read_error_answer(payload).message
    if status == 404:
        raise Unavailable(
            f"replica {replica_id}: its worker does not serve {WORKER_FAULTS_PATH} "
            f"(it was not started with {ENV_FLAG}=1): {message}"
        )
    if 400 <= status < 500:
        raise InvalidRequest(f"replica {replica_id} refused the fault: {message}")
    raise WorkerFailed(f"replica {replica_id} answered {status}: {message}")
