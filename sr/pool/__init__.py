"""sr.pool: the replica pool — dispatch, admission, backoff, ejection, supervision.

Pure policy: `state`, `backoff`, `ejection`, `policy`, `record`, `identity`, `durations`.
I/O: `transport`, `replica` (one task per replica), `deployment`, `core` (`open_router`).
"""

from sr.errors import ReloadFailed, StartupFailed
from sr.pool.core import RouterCore, open_router
from sr.pool.deployment import Reply

__all__ = ["ReloadFailed", "Reply", "RouterCore", "StartupFailed", "open_router"]
