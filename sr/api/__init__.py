"""sr.api: the typed Python API (docs/python-api.md).

`results` (the frozen result classes, re-exported here and from `sr`), `codec` (request
bodies out, answers and worker errors in) and `typed` (`TypedApi`: `request` and the four
typed helpers over the pool's dispatch, held by sr.pool.supervisor.Supervisor).
Importing this package loads the result classes only (attrs): `import sr` stays cheap.
"""

from sr.api.results import (
    Classification,
    Classifications,
    Decision,
    Decisions,
    Embeddings,
    Question,
    Reranking,
    RerankResult,
    Usage,
)

__all__ = [
    "Classification",
    "Classifications",
    "Decision",
    "Decisions",
    "Embeddings",
    "Question",
    "RerankResult",
    "Reranking",
    "Usage",
]
