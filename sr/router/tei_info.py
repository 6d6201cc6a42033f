"""TEI's `GET /info` object for one deployment, from a ready replica's worker card. Pure."""

from __future__ import annotations

from typing import Any

from sr.pool.policy import MAX_INFLIGHT
from sr.worker.validation import MAX_INPUTS

INFO_PATH = "/info"
_POOLING_NAMES = {"lasttoken": "last_token"}  # TEI's spelling of sentence-transformers' modes


def info(
    card: dict[str, Any], *, deployment: str, ready_replicas: int, version: str
) -> dict[str, Any]:
    """TEI's info object for one deployment, from a ready replica's worker card."""
    limits = card.get("limits") or {}
    return {
        "model_id": card.get("artifact") or card.get("id"),
        "model_sha": card.get("revision"),
        "model_dtype": card.get("dtype"),
        "served_model_name": deployment,
        "model_type": _model_type(card),
        # Requests each replica admits at once, times the ready replicas.
        "max_concurrent_requests": MAX_INFLIGHT * ready_replicas,
        "max_input_length": limits.get("max_input_tokens"),
        "max_batch_tokens": limits.get("max_num_batched_tokens"),
        "max_batch_requests": limits.get("max_num_seqs"),
        "max_client_batch_size": MAX_INPUTS,
        "auto_truncate": card.get("overflow") == "truncate",
        # Each worker tokenizes its own requests (on its event loop, or one helper thread
        # for long inputs): one tokenizer per ready replica.
        "tokenization_workers": ready_replicas,
        "version": version,
        "sha": None,
        "docker_label": None,
        # sr extensions: the folder's prompts, which `prompt_name` names (sr.models.prompts)
        "prompts": (card.get("prompts") or {}).get("texts"),
        "default_prompt_name": (card.get("prompts") or {}).get("default_prompt_name"),
    }


def _model_type(card: dict[str, Any]) -> dict[str, Any]:
    """TEI's model_type: a classifier head with one output is a reranker."""
    labels = card.get("head_labels")
    if labels:
        id2label = {str(i): label for i, label in enumerate(labels)}
        label2id = {label: i for i, label in enumerate(labels)}
        # TEI has no token-classification type; a token head is a classifier (of tokens).
        reranker = len(labels) == 1 and card.get("head_task") != "token"
        kind = "reranker" if reranker else "classifier"
        return {kind: {"id2label": id2label, "label2id": label2id}}
    if card.get("sparse"):
        return {"embedding": {"pooling": "splade"}}  # TEI's name for SPLADE pooling
    modes = card.get("pooling") or []
    pooling = "+".join(_POOLING_NAMES.get(mode, mode) for mode in modes) or None
    return {"embedding": {"pooling": pooling}}
