"""`POST /api/v1/faults`: set a fault on one replica's worker, for chaos tests.

Body: `{"deployment": name, "replica": <replica id or 0-based index>, "mode":
"none|hang|slow|fail|exit", "slow_ms": N}`. The router forwards `{mode, slow_ms}` to that
replica's worker (`POST /admin/faults`, sr.worker.faults) through the pool
(`Supervisor.post_to_worker`, over the pool's own transport), so the fault lands on exactly
the process the pool dispatches to.

The route exists only when the router process was started with `SR_FAULT_INJECTION=1`
(its managed workers inherit the variable and serve `/admin/faults`): sr.router.app puts it
in its route table then (POST only), and otherwise answers 404 as for any path it does not
hold, with `disabled_fault_route`'s words. It sits behind the listener's API keys like
every other route.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from sr.error_answer import read_error_answer
from sr.errors import (
    InvalidRequest,
    NotFound,
    RequestError,
    Unavailable,
    WorkerFailed,
)
from sr.http.asgi import Receive, Send, read_body, request_headers, send_error, send_json
from sr.http.jsonbody import parse_json_object
from sr.settings import FAULT_INJECTION_ENV
from sr.worker.faults import fault_of
from sr.worker.validation import check_fields

if TYPE_CHECKING:
    from sr.pool.worker_exchange import WorkerAnswer

FAULTS_PATH = "/api/v1/faults"
WORKER_FAULTS_PATH = "/admin/faults"
MAX_FAULT_BODY_BYTES = 4096  # the body is four small fields
FORWARD_TIMEOUT_S = 5.0  # a stopped (SIGSTOP) worker must not hold the caller forever
_FIELDS = frozenset({"deployment", "replica", "mode", "slow_ms"})


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


class WorkerPoster(Protocol):
    """The part of the pool the route uses (sr.pool.supervisor.Supervisor.post_to_worker)."""

    async def post_to_worker(
        self, deployment: str, replica: str | int, path: str, body: bytes, *, timeout_s: float
    ) -> WorkerAnswer: ...


def disabled_fault_route() -> NotFound:
    """The 404 of `FAULTS_PATH` while fault injection is off."""
    return NotFound(
        f"no route {FAULTS_PATH} (start the router with {FAULT_INJECTION_ENV}=1 to enable it)"
    )


class FaultRoute:
    """The ASGI handler of `POST FAULTS_PATH` (the app's route table holds it while fault
    injection is on)."""

    def __init__(self, core: WorkerPoster) -> None:
        self.core = core

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            (content_length,) = request_headers(scope, b"content-length")
            raw = await read_body(receive, content_length, MAX_FAULT_BODY_BYTES)
            answer = await self.apply(parse_fault_request(raw))
        except RequestError as error:
            await send_error(send, error)
            return
        await send_json(send, 200, answer)

    async def apply(self, request: FaultRequest) -> dict[str, Any]:
        """Forward the fault to the worker; its answer (the fault card) comes back."""
        answer = await self.core.post_to_worker(
            request.deployment,
            request.replica,
            WORKER_FAULTS_PATH,
            request.worker_body(),
            timeout_s=FORWARD_TIMEOUT_S,
        )
        return _answer(answer.replica, answer.pid, answer.status, answer.body)


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
            f"(it was not started with {FAULT_INJECTION_ENV}=1): {message}"
        )
    if 400 <= status < 500:
        raise InvalidRequest(f"replica {replica_id} refused the fault: {message}")
    raise WorkerFailed(f"replica {replica_id} answered {status}: {message}")
