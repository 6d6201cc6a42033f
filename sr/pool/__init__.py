"""sr.pool: the replica pool — dispatch, admission, backoff, ejection, supervision.

Pure policy: `state`, `backoff`, `ejection`, `policy`, `record`, `identity`,
`membership` (discovered sets and when to resolve), `views` (the inventory as typed values,
and its JSON, for the front end and the Python API).
I/O: `transport`, `worker_access` (keys, CA bundles), `replica` (one task per replica),
`discovery` (one task per `discover` entry), `deployment`, `supervisor` (`Supervisor`,
`open_router`).

The names below are imported on first use, as `sr`'s are: the fork server
(`python -m sr.pool.forkserver`) lives in this package, and importing the whole pool with
it (trio, httpx, the supervisor) cost each start about 0.2 s before any worker could fork.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

_LAZY = {
    "DnsResolver": "sr.pool.discovery",
    "ReloadFailed": "sr.errors",
    "Reply": "sr.pool.deployment",
    "Resolver": "sr.pool.discovery",
    "StartupFailed": "sr.errors",
    "Supervisor": "sr.pool.supervisor",
    "open_router": "sr.pool.supervisor",
}
__all__ = [
    "DnsResolver",
    "ReloadFailed",
    "Reply",
    "Resolver",
    "StartupFailed",
    "Supervisor",
    "open_router",
]

if TYPE_CHECKING:
    from sr.errors import ReloadFailed, StartupFailed
    from sr.pool.deployment import Reply
    from sr.pool.discovery import DnsResolver, Resolver
    from sr.pool.supervisor import Supervisor, open_router
else:
    # Hidden from type checkers, as in sr/__init__.py: a module __getattr__ would make every
    # misspelt name type-check.
    from sr.lazy_names import names_from as _names_from

    __getattr__ = _names_from(__name__, _LAZY, globals())
