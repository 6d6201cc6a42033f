"""POST /v1/sparse_embeddings: a sparse encoder's (SPLADE) vectors, each as its non-zero
entries (vocabulary ids ascending, and their values), the `indices`/`values` pair that
sparse vector stores take. Texts only; prompts as on /v1/embeddings (sr.worker.prompting).
"""

from __future__ import annotations

from typing import Any

from sr.errors import InvalidRequest
from sr.worker import validation as v
from sr.worker.prompting import prompt_text

SPARSE_FIELDS = frozenset(
    {"model", "input", "truncate", "truncation_direction", "prompt_name", "task"}
)


async def sparse_embeddings(tasks, body: dict[str, Any]) -> dict[str, Any]:
    """`tasks`: the worker's sr.worker.tasks.Tasks (its rows, overflow rule and engine)."""
    v.check_fields(body, allowed=SPARSE_FIELDS, required=("input",))
    model_name = tasks._served_model(body)
    if not tasks.sparse:
        raise InvalidRequest(
            "this deployment's model is not a sparse encoder; /v1/sparse_embeddings needs "
            "a SparseEncoder folder (MLMTransformer -> SpladePooling)"
        )
    texts, fields = v.inputs(body["input"])
    texts, _ = tasks._prompted(texts, prompt_text(body, tasks.prompts))
    rows, usage = await tasks._rows(texts, fields, tasks._overflow(body), tasks._cut(body))
    entries = await tasks.engine.compute("sparse", rows)
    data = [
        {"object": "sparse_embedding", "index": i, "indices": indices, "values": values}
        for i, (indices, values) in enumerate(entries)
    ]
    return {"object": "list", "model": model_name, "data": data, "usage": usage}
