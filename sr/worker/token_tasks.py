"""The tasks about tokens rather than vectors or labels: /v1/tokenize, /v1/token_embeddings
(TEI's /embed_all: the last hidden state per token, before pooling) and /v1/detokenize
(TEI's /decode). Functions of the worker's `Tasks` (sr.worker.tasks, which routes to them and
is passed in untyped, as sr.worker.token_classify takes it: typing it would be an import loop)."""

from __future__ import annotations

import functools
from typing import Any

import trio

from sr.errors import InvalidRequest, RequestTooLarge
from sr.http.jsonbody import json_kind
from sr.worker import validation as v
from sr.worker.embedding_answer import VectorList
from sr.worker.prompting import prompt_text

_TOKENIZE_FIELDS = frozenset({"model", "input", "add_special_tokens"})
_TOKEN_EMBEDDINGS_FIELDS = frozenset(
    {"model", "input", "truncate", "truncation_direction", "prompt_name", "task"}
)
_DETOKENIZE_FIELDS = frozenset({"model", "ids", "skip_special_tokens"})
# Tokenizing more characters than this moves to a helper thread so the event loop stays free.
INLINE_TOKENIZE_CHARS = 16_384


async def tokenize(tasks: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Each text as the model's tokenizer splits it, one entry per token: its id, its
    text (the input's own characters; the token itself for a special one), whether it is
    special, and its code-point offsets [start, stop) into the input (null for special
    tokens). Nothing is truncated; no forward runs."""
    v.check_fields(body, allowed=_TOKENIZE_FIELDS, required=("input",))
    model_name = tasks._served_model(body)
    texts, _fields = v.inputs(body["input"])
    add_special = v.boolean(body.get("add_special_tokens", True), "add_special_tokens")
    encode = functools.partial(
        tasks.model.tokenizer.encode_batch, texts, add_special_tokens=add_special
    )
    if sum(map(len, texts)) > INLINE_TOKENIZE_CHARS:
        encodings = await trio.to_thread.run_sync(encode)
    else:
        encodings = encode()
    rows = [_token_entries(text, encoding) for text, encoding in zip(texts, encodings, strict=True)]
    data = [{"index": index, "tokens": row} for index, row in enumerate(rows)]
    tokens = sum(map(len, rows))
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "model": model_name, "data": data, "usage": usage}


async def token_embeddings(tasks: Any, body: dict[str, Any]) -> VectorList:
    """Each text's last hidden state per token (special tokens included), before
    pooling: TEI's /embed_all. Under the overflow rule as /v1/embeddings; prompts as on
    /v1/embeddings (sr.worker.prompting), the prompt's tokens answered with the text's."""
    v.check_fields(body, allowed=_TOKEN_EMBEDDINGS_FIELDS, required=("input",))
    model_name = tasks._served_model(body)
    texts, fields = v.inputs(body["input"])
    texts, _ = tasks._prompted(texts, prompt_text(body, tasks.prompts))
    rows, usage = await tasks._rows(texts, fields, tasks._overflow(body), tasks._cut(body))
    states = await tasks.engine.compute("hidden", rows)
    return VectorList.token_embeddings(model_name, states, usage)


async def detokenize(tasks: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Token ids back to text through the model's tokenizer (TEI's /decode): `ids` is
    one list of ids or a list of them; special tokens are skipped unless
    `skip_special_tokens` is false. No forward runs."""
    v.check_fields(body, allowed=_DETOKENIZE_FIELDS, required=("ids",))
    model_name = tasks._served_model(body)
    ids = body["ids"]
    if not isinstance(ids, list) or not ids:
        raise InvalidRequest("ids: expected a non-empty list of token ids or of lists of them")
    vocab = tasks._vocab_size()
    if isinstance(ids[0], list):
        if len(ids) > v.MAX_INPUTS:
            raise RequestTooLarge(f"ids: {len(ids)} items; the limit is {v.MAX_INPUTS}")
        rows = []
        for i, row in enumerate(ids):
            if not isinstance(row, list):
                raise InvalidRequest(
                    f"ids[{i}]: expected a list of token ids, got {json_kind(row)}"
                )
            rows.append(v.token_ids(row, f"ids[{i}]", vocab, item=f"ids[{i}]"))
    else:
        rows = [v.token_ids(ids, "ids", vocab, item="ids")]
    skip = v.boolean(body.get("skip_special_tokens", True), "skip_special_tokens")
    texts = tasks.model.tokenizer.decode_batch(rows, skip_special_tokens=skip)
    data = [{"index": i, "text": text} for i, text in enumerate(texts)]
    return {"object": "list", "model": model_name, "data": data}


def _token_entries(text: str, encoding) -> list[dict[str, Any]]:
    """One tokenizers Encoding as token entries; offsets are Python's (code points)."""
    entries = []
    spans = zip(
        encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
    )
    for token_id, token, (start, stop), special in spans:
        if special:
            entries.append(
                {"id": token_id, "text": token, "special": True, "start": None, "stop": None}
            )
        else:
            entries.append(
                {
                    "id": token_id,
                    "text": text[start:stop],
                    "special": False,
                    "start": start,
                    "stop": stop,
                }
            )
    return entries
