"""sr.api: the typed Python API (docs/python-api.md).

`results` (the frozen result classes, re-exported here and from `sr`), `codec` (request
bodies out, answers and worker errors in) and `typed` (`TypedApi`: `request` and the four
typed helpers over the pool's dispatch, held by sr.pool.supervisor.Supervisor).
Importing this package loads the result classes only (attrs): `import sr` stays cheap.
"""

# The result classes, re-exported by the star import (type checkers read results.__all__).
from sr.api.results import *  # noqa: F403
