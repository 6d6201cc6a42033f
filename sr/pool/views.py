"""Typed views of the pool for everyone outside it: the inventory.

The pool builds them at one instant (`Supervisor.inventory()`: each deployment pool, replica
record and discovery group describes itself); the HTTP routes, the metrics, `sr inventory`
and the Python API read the same classes, so no reader guesses a shape.

Rules:
- A view is a frozen snapshot: it is never updated, and building one reads no clock but the
  `now` it is given.
- `inventory_json` is the one way from a view to the JSON of
  GET /api/v1/inventory/model-runtime: keys in field order, and the optional fields
  (`adaptive_threads`, `ejected_for_ms`, `discovery`) left out while they are None.
  `startup_status_json` is GET /startup-status: the same, each replica cut to the fields a
  start-up watcher reads.
- `inventory_from_json` is the way back (`sr inventory` reads a router over HTTP): keys it
  does not know are ignored (a newer router may add some); a missing or mistyped field
  raises `InventoryShapeError` naming where it is. Nothing is coerced (`"3"` is not 3).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from sr.pool.state import ReplicaState

DeploymentState = Literal["ready", "degraded", "starting", "unavailable"]
MembershipStatus = Literal["member", "joining", "leaving"]


@attrs.frozen
class ResolutionView:
    """One resolution of a `discover` name (sr.pool.membership.Resolution), for people."""

    at: str  # UTC wall time, ISO 8601 to the second
    age_s: float
    count: int
    error: str | None


@attrs.frozen
class DiscoveredAddress:
    address: str  # host:port, an IPv6 host in brackets
    replica: str
    status: MembershipStatus
    # A joining address is not among the deployment's replicas: these say why it waits.
    state: ReplicaState
    reason: str | None


@attrs.frozen
class DiscoveryView:
    """One `discover` entry of a deployment (sr.pool.discovery.DiscoveryGroup)."""

    discover: str
    scheme: str
    refresh_s: int
    discovered: tuple[DiscoveredAddress, ...]
    last_resolution: ResolutionView | None
    last_good_resolution: ResolutionView | None
    next_resolution_in_s: float


@attrs.frozen
class ReplicaView:
    id: str
    device: str | None  # a managed replica's device; None for an attached one
    endpoint: str | None  # an attached replica's URL; None for a managed one
    state: ReplicaState  # overlays applied (sr.pool.state.effective_state)
    ready: bool
    inflight: int
    outstanding_bytes: int
    restarts: int
    consecutive_timeouts: int
    ejections: int
    threads: int | None
    pid: int | None
    reason: str | None
    # The worker's own report of its thread learning, passed on as it came (its card's
    # `adaptive_threads`); the router reads nothing in it. Only while learning is on.
    adaptive_threads: Mapping[str, Any] | None = None
    ejected_for_ms: int | None = None  # only while ejected

    @property
    def placement(self) -> str | None:
        return self.device or self.endpoint


@attrs.frozen
class DeploymentView:
    artifact: str
    desired_replicas: int  # a discover entry counts the addresses it resolved to
    ready_replicas: int  # ready or in backoff
    state: DeploymentState
    restarts: int
    replicas: tuple[ReplicaView, ...]  # published ones: dispatched to, or draining
    discovery: tuple[DiscoveryView, ...] | None = None  # only with `discover` entries
    # The folder's prompts, as a ready replica's card has them ({texts, default_prompt_name});
    # only once one is ready.
    prompts: Mapping[str, Any] | None = None


@attrs.frozen
class Inventory:
    ready: bool  # every deployment has a ready replica (what /ready answers)
    deployments: Mapping[str, DeploymentView]


class InventoryShapeError(ValueError):
    """JSON that is not an inventory this sr can read; the message names the field."""


# GET /startup-status keeps these of each replica, in this order.
STARTUP_REPLICA_FIELDS = ("id", "device", "endpoint", "state", "reason", "restarts", "pid")


def inventory_json(inventory: Inventory) -> dict[str, Any]:
    """The inventory as JSON-ready data (GET /api/v1/inventory/model-runtime)."""
    data: dict[str, Any] = _converter().unstructure(inventory)
    return data


def startup_status_json(inventory: Inventory) -> dict[str, Any]:
    """GET /startup-status: the inventory, each replica cut to STARTUP_REPLICA_FIELDS."""
    data = inventory_json(inventory)
    for deployment in data["deployments"].values():
        deployment["replicas"] = [
            {key: row[key] for key in STARTUP_REPLICA_FIELDS} for row in deployment["replicas"]
        ]
    return data


def inventory_from_json(data: Any) -> Inventory:
    """Parsed JSON of GET /api/v1/inventory/model-runtime as an Inventory;
    InventoryShapeError naming the first field that is missing or of the wrong type."""
    if not isinstance(data, dict):
        raise InventoryShapeError(f"inventory: expected an object, got {_json_type(data)}")
    try:
        return _converter().structure(data, Inventory)
    except Exception as error:  # cattrs reports every failure in an exception group
        problems = cattrs.transform_error(error, path="inventory", format_exception=_problem)
        message, _, where = (problems[0] if problems else str(error)).rpartition(" @ ")
        raise InventoryShapeError(f"{where}: {message}" if message else where) from None


def _problem(error: BaseException, _: Any) -> str:
    if isinstance(error, KeyError):
        return "required field missing"
    return str(error) or type(error).__name__


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "?")


def _exactly(*kinds: type) -> Any:
    """A structure hook that takes a value of one of `kinds` as it is and refuses the rest
    (a boolean is never a number here)."""

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
            return value
        raise TypeError(f"expected {kinds[0].__name__}, got {_json_type(value)}")

    return structure


def _one_of(choices: tuple[str, ...], build: Any = None) -> Any:
    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value if build is None else build(value)

    return structure


@functools.cache
def _converter() -> cattrs.Converter:
    """Built on first use, not at import: its generated hooks took 15 ms of every router's
    start (a 2-core AMD host), and only the inventory's and start-up status's routes and
    `sr inventory` use it."""
    converter = cattrs.Converter(unstruct_collection_overrides={tuple: list})
    converter.register_structure_hook(str, _exactly(str))
    converter.register_structure_hook(int, _exactly(int))
    converter.register_structure_hook(float, _exactly(float, int))
    converter.register_structure_hook(bool, _exactly(bool))
    states = tuple(state.value for state in ReplicaState)
    converter.register_structure_hook(ReplicaState, _one_of(states, ReplicaState))
    for literal in (DeploymentState, MembershipStatus):
        converter.register_structure_hook_func(_is(literal), _one_of(get_args(literal)))
    converter.register_structure_hook_func(
        _is(Mapping[str, Any]), _only(dict, lambda value, _: value)
    )
    # A JSON object or list exactly, not any mapping or iterable (a string would pass as
    # its letters); inner parts first, so that the outer hooks are built on the checked ones.
    containers: list[tuple[Any, type]] = [
        (ResolutionView, dict),
        (DiscoveredAddress, dict),
        (tuple[DiscoveredAddress, ...], list),
        (DiscoveryView, dict),
        (tuple[DiscoveryView, ...], list),
        (ReplicaView, dict),
        (tuple[ReplicaView, ...], list),
        (DeploymentView, dict),
        (Mapping[str, DeploymentView], dict),
    ]
    for kind, json_kind in containers:
        converter.register_structure_hook_func(
            _is(kind), _only(json_kind, converter.get_structure_hook(kind))
        )
    for cls in (ReplicaView, DeploymentView):
        optional: dict[str, Any] = {
            field.name: override(omit_if_default=True)
            for field in attrs.fields(cls)
            if field.default is None
        }
        converter.register_unstructure_hook(
            cls, make_dict_unstructure_fn(cls, converter, **optional)
        )
    return converter


def _is(kind: Any) -> Callable[[Any], bool]:
    """A hook predicate: exactly this type (generic aliases and Literals are not classes)."""
    return functools.partial(operator.eq, kind)


def _only(json_kind: type, structure_parts: Any) -> Any:
    """`structure_parts` for a JSON object (`dict`) or list only."""

    def structure(value: Any, kind: Any) -> Any:
        if not isinstance(value, json_kind):
            raise TypeError(f"expected {_json_type(json_kind())}, got {_json_type(value)}")
        return structure_parts(value, kind)

    return structure
