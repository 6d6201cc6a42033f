"""sr.pool: the replica pool — dispatch, admission, backoff, ejection, supervision.

Pure policy: `state`, `backoff`, `ejection`, `policy`, `record`, `identity`,
`membership` (discovered sets and when to resolve), `views` (the inventory as typed values,
and its JSON, for the front end and the Python API).
I/O: `transport`, `worker_access` (keys, CA bundles), `replica` (one task per replica),
`discovery` (one task per `discover` entry), `deployment`, `supervisor` (`Supervisor`,
`open_router`).
"""

from sr.errors import ReloadFailed, StartupFailed
from sr.pool.deployment import Reply
from sr.pool.discovery import DnsResolver, Resolver
from sr.pool.supervisor import Supervisor, open_router

__all__ = [
    "DnsResolver",
    "ReloadFailed",
    "Reply",
    "Resolver",
    "StartupFailed",
    "Supervisor",
    "open_router",
]
