"""POST /v1/classify on a token-classification head (PII and NER detectors): the entities
of each text, as transformers' token-classification pipeline gives them (sr.worker.entities).

    {model, input: str | [str], aggregation_strategy?, ignore_labels?, truncate?}
    -> {model, results: [{index, entities: [...]}], usage}

`aggregation_strategy` is one of none, simple (the default), first, average, max (any
case); `ignore_labels` a list of labels, default ["O"]. Zero-shot `labels` do not apply to
a head that labels tokens and are refused naming the field. A text over input.max_tokens is
refused or cut by the overflow rule; a cut text keeps its closing special tokens, and the
offsets of the tokens kept are the caller's text's.
"""

from __future__ import annotations

from typing import Any

import trio

from sr.errors import InvalidRequest, RequestTooLarge
from sr.http.jsonbody import json_kind
from sr.worker import timing
from sr.worker import validation as v
from sr.worker.entities import DEFAULT_IGNORE, DEFAULT_STRATEGY, STRATEGIES, TokenWords, entities

FIELDS = frozenset({"model", "input", "aggregation_strategy", "ignore_labels", "truncate"})
# Fields only a token-classification head takes (a sequence head refuses them by name).
TOKEN_ONLY_FIELDS = ("aggregation_strategy", "ignore_labels")
# Tokenizing more characters than this moves to a helper thread (as sr.worker.tasks).
_INLINE_TOKENIZE_CHARS = 16_384


def strategy_of(value: Any) -> str:
    """`aggregation_strategy`: a strategy's name in any case; null is the default."""
    if value is None:
        return DEFAULT_STRATEGY
    if not isinstance(value, str) or value.lower() not in STRATEGIES:
        raise InvalidRequest(
            f"aggregation_strategy: expected one of {', '.join(STRATEGIES)}, got "
            f"{value if isinstance(value, str) else json_kind(value)!r}"
        )
    return value.lower()


def ignore_labels_of(value: Any) -> tuple[str, ...]:
    """`ignore_labels`: a list of labels (possibly empty); null is the default ["O"]."""
    if value is None:
        return DEFAULT_IGNORE
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidRequest(f"ignore_labels: expected a list of strings, got {json_kind(value)}")
    if len(value) > v.MAX_LABELS:
        raise RequestTooLarge(f"ignore_labels: {len(value)} items; the limit is {v.MAX_LABELS}")
    return tuple(value)


class TokenClassifier:
    """The token head's /v1/classify, on the Tasks object that owns the engine."""

    def __init__(self, tasks) -> None:
        self.tasks = tasks
        self.model = tasks.model
        self.words = TokenWords.of(self.model.tokenizer)
        # The closing special tokens a cut row keeps ([SEP], </s>): the tokenizer's
        # frame around an empty text after its first token, as EncoderModel.truncate cuts.
        self.closing = max(len(self.model.tokenizer.encode("").ids) - 1, 0)

    async def classify(self, body: dict[str, Any]) -> dict[str, Any]:
        tasks = self.tasks
        if "labels" in body:
            raise InvalidRequest(
                "labels: zero-shot labels do not apply to this model: its head labels each "
                f"token with its own labels ({', '.join(self.model.head_labels)}); send "
                "input alone"
            )
        v.check_fields(body, allowed=FIELDS, required=("input",))
        model_name = tasks._served_model(body)
        strategy = strategy_of(body.get("aggregation_strategy"))
        ignore = ignore_labels_of(body.get("ignore_labels"))
        texts, fields = v.inputs(body["input"])
        encodings = await self._encode(texts)
        rows, usage = tasks._limit([e.ids for e in encodings], fields, tasks._overflow(body))
        logits = await tasks.engine.compute("token", rows)
        labels = self.model.head_labels
        results = []
        for index, (text, encoding, row, row_logits) in enumerate(
            zip(texts, encodings, rows, logits, strict=True)
        ):
            found = entities(
                text, _row_tokens(encoding, len(row), self.closing), row_logits, labels,
                self.words,
                strategy, ignore,
            )  # fmt: skip
            results.append({"index": index, "entities": found})
        return {"model": model_name, "results": results, "usage": usage}

    async def _encode(self, texts: list[str]) -> list:
        characters = sum(map(len, texts))
        timing.note_characters(characters)
        encode = self.model.tokenizer.encode_batch
        if characters > _INLINE_TOKENIZE_CHARS:
            return await trio.to_thread.run_sync(encode, texts)
        return encode(texts)


def _row_tokens(encoding, kept: int, closing: int) -> list[tuple[int, int, int, bool]]:
    """(id, start, end, special) of each position of the row served: the whole encoding,
    or, for a row cut to `kept` tokens, its first tokens and its `closing` special tokens
    (as sr.models.encoder.EncoderModel.truncate cuts it)."""
    ids, offsets, special = encoding.ids, encoding.offsets, encoding.special_tokens_mask
    total = len(ids)
    positions = range(total)
    if kept < total:
        positions = [*range(kept - closing), *range(total - closing, total)]
    return [(ids[i], offsets[i][0], offsets[i][1], bool(special[i])) for i in positions]
