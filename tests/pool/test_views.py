"""The inventory's typed views (sr.pool.views): their JSON, and reading it back."""

from __future__ import annotations

import json

import pytest

from sr.pool.state import ReplicaState
from sr.pool.views import (
    DeploymentView,
    DiscoveredAddress,
    DiscoveryView,
    Inventory,
    InventoryShapeError,
    ReplicaView,
    ResolutionView,
    inventory_from_json,
    inventory_json,
    startup_status_json,
)

S = ReplicaState


def replica(replica_id: str, state: ReplicaState, **optional) -> ReplicaView:
    return ReplicaView(
        id=replica_id, device="cpu", endpoint=None, state=state, ready=state is S.READY,
        inflight=1, outstanding_bytes=20, restarts=2, consecutive_timeouts=3, ejections=4,
        threads=2, pid=77, reason=None, **optional,
    )  # fmt: skip


RESOLVED = ResolutionView(at="2026-12-03T06:31:46Z", age_s=2.1, count=1, error=None)
INVENTORY = Inventory(
    ready=True,
    deployments={
        "primary": DeploymentView(
            artifact="/m", desired_replicas=2, ready_replicas=1, state="degraded", restarts=2,
            replicas=(
                replica("p-0", S.READY),
                replica("p-1", S.EJECTED, adaptive_threads={"mode": 1}, ejected_for_ms=1500),
            ),
        ),
        "found": DeploymentView(
            artifact="/m", desired_replicas=1, ready_replicas=0, state="starting", restarts=0,
            replicas=(),
            discovery=(
                DiscoveryView(
                    discover="dns://w:8100", scheme="http", refresh_s=10,
                    discovered=(
                        DiscoveredAddress("10.0.0.1:8100", "found-1", "joining", S.LOADING, "x"),
                    ),
                    last_resolution=RESOLVED, last_good_resolution=None,
                    next_resolution_in_s=7.9,
                ),
            ),
        ),
    },
)  # fmt: skip
# What GET /api/v1/inventory/model-runtime has always served for it (sr.http.asgi.send_json's
# separators): field order, and the optional fields only where they are set.
WIRE = (
    '{"ready":true,"deployments":{"primary":{"artifact":"/m","desired_replicas":2,'
    '"ready_replicas":1,"state":"degraded","restarts":2,"replicas":['
    '{"id":"p-0","device":"cpu","endpoint":null,"state":"ready","ready":true,"inflight":1,'
    '"outstanding_bytes":20,"restarts":2,"consecutive_timeouts":3,"ejections":4,"threads":2,'
    '"pid":77,"reason":null},'
    '{"id":"p-1","device":"cpu","endpoint":null,"state":"ejected","ready":false,"inflight":1,'
    '"outstanding_bytes":20,"restarts":2,"consecutive_timeouts":3,"ejections":4,"threads":2,'
    '"pid":77,"reason":null,"adaptive_threads":{"mode":1},"ejected_for_ms":1500}]},'
    '"found":{"artifact":"/m","desired_replicas":1,"ready_replicas":0,"state":"starting",'
    '"restarts":0,"replicas":[],"discovery":[{"discover":"dns://w:8100","scheme":"http",'
    '"refresh_s":10,"discovered":[{"address":"10.0.0.1:8100","replica":"found-1",'
    '"status":"joining","state":"loading","reason":"x"}],"last_resolution":'
    '{"at":"2026-12-03T06:31:46Z","age_s":2.1,"count":1,"error":null},'
    '"last_good_resolution":null,"next_resolution_in_s":7.9}]}}}'
)


def wire(data) -> str:
    return json.dumps(data, separators=(",", ":"))


def test_the_json_is_the_wire_shape_in_field_order():
    assert wire(inventory_json(INVENTORY)) == WIRE


def test_the_json_reads_back_into_equal_views():
    assert inventory_from_json(json.loads(WIRE)) == INVENTORY


def test_startup_status_cuts_each_replica_to_what_a_watcher_reads():
    data = startup_status_json(INVENTORY)
    (first, _) = data["deployments"]["primary"]["replicas"]
    assert list(first) == ["id", "device", "endpoint", "state", "reason", "restarts", "pid"]
    assert data["ready"] is True and data["deployments"]["found"]["discovery"][0]["scheme"]
    assert wire(inventory_json(INVENTORY)) == WIRE  # the views themselves are untouched


def _with(path: list, value) -> dict:
    data = json.loads(WIRE)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


REPLICA = ["deployments", "primary", "replicas", 0]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "inventory: expected an object, got a list"),
        ({"ready": True}, "inventory.deployments: required field missing"),
        (_with(["ready"], 1), "inventory.ready: expected bool, got a number"),
        (_with([*REPLICA, "inflight"], True), "replicas[0].inflight: expected int, got a boolean"),
        (_with([*REPLICA, "pid"], "77"), "replicas[0].pid: expected int, got a string"),
        (_with([*REPLICA, "state"], "dozing"), "replicas[0].state: expected one of starting,"),
        (_with(["deployments", "primary", "replicas"], "ab"), "replicas: expected a list"),
        (_with(["deployments", "found", "state"], "?"), "['found'].state: expected one of ready"),
        (
            _with(["deployments", "found", "discovery", 0, "last_resolution"], 3),
            "discovery[0].last_resolution: expected an object, got a number",
        ),
    ],
)
def test_a_wrong_shape_names_the_field(data, message):
    with pytest.raises(InventoryShapeError) as raised:
        inventory_from_json(data)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
