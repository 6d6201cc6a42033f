"""Unit tests of the router's fault-injection route (sr.router.faults), no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from sr.config.schema import SrConfig
from sr.errors import InvalidRequest
from sr.events import EventSink
from sr.pool.supervisor import Supervisor
from sr.pool.transport import TransportError
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.faults import (
    FAULTS_PATH,
    FaultRoute,
    parse_fault_request,
)
from sr.router.metrics import RouterMetrics
from sr.settings import Settings
from sr.worker.faults import FaultState
from tests.router.asgi_client import call


class FakeTransport:
    def __init__(self, answer=(200, {}, b'{"mode":"hang","slow_ms":0}'), error=None, hang=False):
        self.answer = answer
        self.error = error
        self.hang = hang
        self.calls: list[tuple[str, str, bytes]] = []

    async def exchange(self, method, path, body=b"", hop=None):
        self.calls.append((method, path, body))
        if self.hang:
            await trio.sleep_forever()
        if self.error is not None:
            raise self.error
        return self.answer


class FakeRecord:
    def __init__(self, pid):
        self.pid = pid


class FakeRunner:
    def __init__(self, transport, pid):
        self.transport = transport
        self.record = FakeRecord(pid)


class FakePool:
    def __init__(self, runners):
        self.runners = runners


def core_over(*transports) -> Supervisor:
    """A real Supervisor (its `post_to_worker` finds the replica) over fake replicas; it
    starts nothing, so its nursery is never used."""
    core = Supervisor(
        SrConfig(),
        None,
        events=EventSink(),
        threads=1,
        run_dir=Path("."),
        worker_factory=None,
        settings=Settings.from_environ({}),
    )
    runners = {f"primary-{i:08x}": FakeRunner(t, 100 + i) for i, t in enumerate(transports)}
    core.pools = {"primary": FakePool(runners)}
    return core


def fault(**fields):
    body = {"deployment": "primary", "replica": 1, "mode": "hang"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def post(route, body, method="POST"):
    return await call(route, method, FAULTS_PATH, body)


def app_over(core: Supervisor, *, enabled: bool) -> RouterApp:
    """The router's app, whose route table holds the fault route only when `enabled`."""
    config = SrConfig()
    return RouterApp(
        core,
        config,
        metrics=RouterMetrics(core.inventory),
        cache=ResultCache(0),
        fault_injection=enabled,
    )


async def test_disabled_route_is_a_plain_404_and_touches_no_worker():
    transport = FakeTransport()
    app = app_over(core_over(transport), enabled=False)
    for method in ("POST", "GET"):
        answer = await post(app, fault(), method=method)
        assert answer.status == 404
        assert answer.json()["error"]["code"] == "not_found"
        assert "SR_FAULT_INJECTION=1" in answer.json()["error"]["message"]
    assert transport.calls == []


async def test_forwards_mode_and_slow_ms_to_the_replica_by_index():
    first = FakeTransport()
    second = FakeTransport(answer=(200, {}, b'{"mode":"slow","slow_ms":50}'))
    answer = await post(FaultRoute(core_over(first, second)), fault(mode="slow", slow_ms=50))
    assert answer.status == 200, answer.body
    assert answer.json() == {
        "replica": "primary-00000001",
        "pid": 101,
        "fault": {"mode": "slow", "slow_ms": 50},
    }
    assert first.calls == []
    assert second.calls == [("POST", "/admin/faults", b'{"mode": "slow", "slow_ms": 50}')]


async def test_replica_by_id():
    first, second = FakeTransport(), FakeTransport()
    route = FaultRoute(core_over(first, second))
    answer = await post(route, fault(replica="primary-00000000", mode="none"))
    assert answer.status == 200
    assert answer.json()["replica"] == "primary-00000000"
    assert json.loads(first.calls[0][2]) == {"mode": "none", "slow_ms": 0}
    assert second.calls == []


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"deployment": "nope"}, 404, "model_not_found"),
        ({"replica": 2}, 404, "replica_not_found"),
        ({"replica": "primary-ffffffff"}, 404, "replica_not_found"),
        ({"replica": -1}, 400, "invalid_request"),
        ({"replica": True}, 400, "invalid_request"),
        ({"replica": 1.5}, 400, "invalid_request"),
        ({"mode": "explode"}, 400, "invalid_request"),
        ({"slow_ms": -1}, 400, "invalid_request"),
        ({"slow_ms": "10"}, 400, "invalid_request"),
        ({"extra": 1}, 400, "invalid_request"),
        ({"mode": None}, 400, "invalid_request"),
    ],
)
async def test_bad_requests_are_named_4xx(fields, status, code):
    transport = FakeTransport()
    route = FaultRoute(core_over(transport, FakeTransport()))
    answer = await post(route, fault(**fields))
    assert answer.status == status, answer.body
    assert answer.json()["error"]["code"] == code
    assert transport.calls == []


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[]", b'"x"', b"\xff\xfe", b"[" * 100_000, b"{}" + b" " * 5000]
)
async def test_malformed_bodies_are_400_or_413(raw):
    answer = await post(FaultRoute(core_over(FakeTransport())), raw)
    assert answer.status in (400, 413)
    assert answer.json()["error"]["code"] in ("invalid_request", "request_too_large")


async def test_get_is_405():
    answer = await post(app_over(core_over(FakeTransport()), enabled=True), b"", method="GET")
    assert answer.status == 405
    assert answer.headers["allow"] == "POST"


async def test_worker_without_fault_injection_is_503_not_a_confusing_404():
    refusing = FakeTransport(answer=(404, {}, b'{"error":{"code":"not_found","message":"x"}}'))
    answer = await post(FaultRoute(core_over(FakeTransport(), refusing)), fault())
    assert answer.status == 503
    assert "SR_FAULT_INJECTION=1" in answer.json()["error"]["message"]


async def test_worker_400_passes_as_400_with_its_message():
    refused = b'{"error":{"code":"invalid_request","message":"m!"}}'
    refusing = FakeTransport(answer=(400, {}, refused))
    answer = await post(FaultRoute(core_over(FakeTransport(), refusing)), fault())
    assert answer.status == 400
    assert "m!" in answer.json()["error"]["message"]


async def test_transport_error_is_502():
    broken = FakeTransport(error=TransportError("ConnectError"))
    answer = await post(FaultRoute(core_over(FakeTransport(), broken)), fault())
    assert answer.status == 502
    assert answer.json()["error"]["code"] == "worker_failed"


async def test_replica_without_worker_is_503():
    core = core_over(FakeTransport(), FakeTransport())
    core.pools["primary"].runners["primary-00000001"].transport = None
    answer = await post(FaultRoute(core), fault())
    assert answer.status == 503
    assert answer.json()["error"]["code"] == "unavailable"


async def test_stopped_worker_times_out_bounded(autojump_clock):
    core = core_over(FakeTransport(), FakeTransport(hang=True))
    with trio.fail_after(10):
        answer = await post(FaultRoute(core), fault())
    assert answer.status == 504
    assert answer.json()["error"]["code"] == "timeout"


@pytest.mark.parametrize(
    "raw", [b"[" * 200_000, b'{"deployment":"p","replica":' + b"9" * 5000 + b',"mode":"none"}']
)
def test_parse_rejects_deep_nesting_and_huge_numbers_as_invalid_request(raw):
    with pytest.raises(InvalidRequest):
        parse_fault_request(raw)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "melt"}, "mode: expected one of none, hang, slow, fail, exit"),
        ({"mode": ["hang"]}, "mode: expected one of none, hang, slow, fail, exit"),
        ({"mode": "slow", "slow_ms": -1}, "slow_ms: expected an integer from 0 to 600000"),
        ({"mode": "slow", "slow_ms": True}, "slow_ms: expected an integer from 0 to 600000"),
        ({"mode": "slow", "slow_ms": 600_001}, "slow_ms: expected an integer from 0 to 600000"),
    ],
)
def test_router_and_worker_refuse_a_bad_fault_with_the_same_words(fields, message):
    """One fault check (sr.worker.faults.fault_of) behind both routes."""
    routed = json.dumps({"deployment": "primary", "replica": 0, **fields}).encode()
    with pytest.raises(InvalidRequest) as at_router:
        parse_fault_request(routed)
    with pytest.raises(InvalidRequest) as at_worker:
        FaultState().configure(json.dumps(fields).encode())
    assert at_router.value.message == at_worker.value.message == message
