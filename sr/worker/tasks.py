"""The worker tasks: body -> rows -> one engine submission -> answer.

Zero-shot classification and decisions compare embeddings by cosine similarity and turn
similarities into probabilities with a softmax at ZERO_SHOT_TEMPERATURE (fixed, so the same
request always gives the same numbers; docs/decisions.md). The arithmetic after the forward
is plain Python on the floats the device thread returned, so no torch runs on the Trio thread.
"""

from __future__ import annotations

import base64
import functools
import math
import struct
from collections.abc import Callable
from typing import Any

import trio

from sr.errors import InvalidRequest, RequestTooLarge
from sr.models.prompts import Prompts
from sr.worker import peer_fields, timing, token_tasks
from sr.worker import validation as v
from sr.worker.document_cut import first_tokens
from sr.worker.embedding_answer import VectorList
from sr.worker.prompting import prompt_length, prompt_text
from sr.worker.served_as import served_model
from sr.worker.sparse_task import sparse_embeddings
from sr.worker.token_classify import TOKEN_ONLY_FIELDS, TokenClassifier

ZERO_SHOT_TEMPERATURE = 0.05
# Tokenizing more characters than this moves to a helper thread so the event loop stays free.
_INLINE_TOKENIZE_CHARS = 16_384

# Every field OpenAI documents for embeddings; `user` is accepted and not used. `normalize`,
# `add_special_tokens` and `truncation_direction` are sr extensions (what TEI's /embed
# needs); `prompt_name` (sentence-transformers', TEI's) and Jina's `task` pick a prompt
# (sr.worker.prompting).
_EMBEDDINGS_FIELDS = frozenset(
    {
        "model", "input", "encoding_format", "dimensions", "user", "truncate", "normalize",
        "add_special_tokens", "truncation_direction", "prompt_name", "task",
    }
)  # fmt: skip
_CLASSIFY_FIELDS = frozenset(
    {"model", "input", "labels", "truncate", "truncation_direction", "raw_scores"}
)
_DECISIONS_FIELDS = frozenset({"model", "state", "questions", "truncate"})
# sr's, TEI's and the fields Cohere's and Jina's rerank APIs define (docs/clients.md's
# table: `rank_fields` picks a document object's text; `max_tokens_per_doc` cuts each
# document (sr.worker.document_cut); `max_chunks_per_doc` is accepted and not applied, as
# sr never splits a document: a pair over input.max_tokens follows the overflow rule).
_RERANK_FIELDS = frozenset(
    {
        "model", "query", "documents", "top_n", "return_documents", "truncate", "raw_scores",
        "truncation_direction", "rank_fields", "max_chunks_per_doc", "max_tokens_per_doc",
    }
)  # fmt: skip
_QUESTION_FIELDS = frozenset({"type", "instructions", "criteria"})


class Tasks:
    def __init__(
        self, model, engine, *, artifact: str, max_input_tokens: int, overflow: str
    ) -> None:
        self.model = model
        self.engine = engine
        self.artifact = artifact
        self.max_input_tokens = max_input_tokens
        self.overflow = overflow
        # /v1/classify on a head that labels tokens answers entities (sr.worker.token_classify).
        self.token_classifier = (
            TokenClassifier(self) if getattr(model, "head_task", None) == "token" else None
        )
        self.sparse = getattr(model, "sparse_head", None) is not None
        # The folder's prompts (sentence-transformers' defaults for a model without them).
        self.prompts: Prompts = getattr(model, "prompts", None) or Prompts()
        self.include_prompt: bool = getattr(model, "include_prompt", True)
        self._prompt_lengths: dict[str, int] = {}

    def _prompted(self, texts: list[str], prompt: str) -> tuple[list[str], int]:
        """The texts with the prompt before each, and how many tokens at a row's start
        pooling leaves out (the prompt's, under the Pooling's `include_prompt: false`)."""
        if not prompt:
            return texts, 0
        skip = 0
        if not self.include_prompt and not self.sparse:
            skip = self._prompt_lengths.get(prompt, -1)
            if skip < 0:
                skip = self._prompt_lengths[prompt] = prompt_length(self.model.tokenizer, prompt)
        return [prompt + text for text in texts], skip

    async def embeddings(self, body: dict[str, Any]) -> VectorList:
        body = peer_fields.embeddings_body(body)  # Jina's and Infinity's fields as sr's
        v.check_fields(body, allowed=_EMBEDDINGS_FIELDS, required=("input",))
        model_name = self._served_model(body)
        if self.sparse:
            raise InvalidRequest(
                "this deployment's model is a sparse encoder (SPLADE): ask /v1/sparse_embeddings "
                "(TEI: /embed_sparse) for its vectors"
            )
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidRequest("encoding_format: expected 'float' or 'base64'")
        if "user" in body and not isinstance(body["user"], str):
            raise InvalidRequest("user: expected a string")
        size = self.model.embedding_dim
        dimensions = None
        if "dimensions" in body:
            dimensions = v.positive_int(body["dimensions"], "dimensions")
            if dimensions > size:
                raise InvalidRequest(
                    f"dimensions: {dimensions} exceeds this model's embedding size {size}"
                )
        # Absent: the checkpoint's own chain. False: the vector before its Normalize module;
        # true: unit length, normalised here when the checkpoint has no Normalize.
        normalize = None
        if "normalize" in body:
            normalize = v.boolean(body["normalize"], "normalize")
        add_special = v.boolean(body.get("add_special_tokens", True), "add_special_tokens")
        kind, items, fields = v.embedding_inputs(body["input"], self._vocab_size)
        prompt = prompt_text(body, self.prompts, token_ids=kind == "ids")
        skip = 0
        if kind == "ids" and add_special:
            # The caller's ids are the text's tokens; the special tokens go around them
            # as around a text, and the overflow rule applies to the framed row.
            framed = [self.model.with_special_tokens(ids) for ids in items]
            rows, usage = self._limit(framed, fields, self._overflow(body), self._cut(body))
        elif kind == "ids":
            # Whole rows, special tokens included (as /v1/tokenize gives them): embedded as
            # given, and a row over the limit is cut as it stands.
            cut = _tail if self._direction(body) == "left" else _head
            rows, usage = self._limit(list(items), fields, self._overflow(body), cut=cut)
        elif not add_special:
            raise InvalidRequest(
                "add_special_tokens: false applies to token-id input only; a text always gets "
                "the model's special tokens"
            )
        else:
            texts, skip = self._prompted(items, prompt)
            rows, usage = await self._rows(texts, fields, self._overflow(body), self._cut(body))
        unnormalized = normalize is False and self.model.normalize
        # Pooling leaves the prompt out from `skip` on, always keeping the row's last token.
        starts = [min(skip, len(ids) - 1) for ids in rows] if skip else None
        vectors = await self.engine.compute(
            "embed_unnormalized" if unnormalized else "embed", rows, starts
        )
        float32 = True  # the model's own values, until made unit length here in float64
        if dimensions is not None and dimensions < size:
            unit = self.model.normalize if normalize is None else normalize
            vectors = [_shorten(vec, dimensions, unit) for vec in vectors]
            float32 = not unit
        elif normalize and not self.model.normalize:
            vectors = [_unit(vec) for vec in vectors]
            float32 = False
        if encoding == "base64":
            vectors = [_base64_float32(vec) for vec in vectors]
            float32 = False
        return VectorList(model_name, vectors, usage, float32)

    async def sparse_embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        return await sparse_embeddings(self, body)  # sr.worker.sparse_task

    async def classify(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.token_classifier is not None:
            return await self.token_classifier.classify(body)
        for name in TOKEN_ONLY_FIELDS:
            if name in body:
                head = "labels whole texts" if self.model.head_labels else "is none of its own"
                raise InvalidRequest(
                    f"{name}: applies to a token-classification head only; this model's head {head}"
                )
        v.check_fields(body, allowed=_CLASSIFY_FIELDS, required=("input",))
        model_name = self._served_model(body)
        overflow = self._overflow(body)
        # The head's logits themselves (TEI's raw_scores), not their probabilities.
        raw_scores = v.boolean(body.get("raw_scores", False), "raw_scores")
        if _is_pair_list(body["input"]) and "labels" not in body:
            keys = self._own_labels()
            pairs, fields = v.text_pairs(body["input"], "input")
            rows, seconds, usage = await self._pair_rows(pairs, fields, overflow, body)
            scores = await self.engine.compute("rerank", rows, seconds)
            return self._classified(model_name, keys, scores, raw_scores, usage)
        texts, fields = v.inputs(body["input"])
        if "labels" in body:
            labels = v.text_map(body["labels"], "labels", limit=v.MAX_LABELS)
            keys = list(labels)
            rows, usage = await self._rows(
                texts + list(labels.values()),
                fields + [f"labels.{k}" for k in keys],
                overflow,
                self._cut(body),
            )
            vectors = await self.engine.compute("embed", rows)
            label_vectors = vectors[len(texts) :]
            scores = [
                [_cosine(vectors[i], lv) / ZERO_SHOT_TEMPERATURE for lv in label_vectors]
                for i in range(len(texts))
            ]
        else:
            keys = self._own_labels()
            rows, usage = await self._rows(texts, fields, overflow, self._cut(body))
            scores = await self.engine.compute("classify", rows)
            return self._classified(model_name, keys, scores, raw_scores, usage)
        return self._classified(model_name, keys, scores, raw_scores, usage, zero_shot=True)

    def _own_labels(self) -> list[str]:
        keys = self.model.head_labels
        if not keys:
            raise InvalidRequest(
                "labels: required; this model has no classification head of its own"
            )
        return keys

    def _classified(
        self,
        model_name: str,
        keys: list[str],
        scores: list[list[float]],
        raw_scores: bool,
        usage: dict,
        zero_shot: bool = False,
    ) -> dict[str, Any]:
        """The /v1/classify answer from each row's scores over `keys`."""
        to_probabilities = _softmax
        if raw_scores:
            to_probabilities = list
        elif not zero_shot and self.model.head_activation == "sigmoid":
            to_probabilities = _sigmoids
        results = []
        for index, row_scores in enumerate(scores):
            probabilities = to_probabilities(row_scores)
            best = max(range(len(keys)), key=probabilities.__getitem__)
            results.append(
                {
                    "index": index,
                    "label": keys[best],
                    "probabilities": dict(zip(keys, probabilities, strict=True)),
                }
            )
        return {"model": model_name, "results": results, "usage": usage}

    async def _pair_rows(
        self, pairs: list[tuple[str, str]], fields: list[str], overflow: str, body: dict
    ) -> tuple[list[list[int]], list[int], dict]:
        """Each (text, text_pair) as one row of the head's input, under the overflow rule
        (cut longest text first, as a cross-encoder's pairs are)."""
        encode = self.model.encode_pair_list
        timing.note_characters(sum(len(a) + len(b) for a, b in pairs))
        encoded = encode(pairs)
        limit = self.max_input_tokens
        over = [i for i, (ids, _) in enumerate(encoded) if len(ids) > limit]
        for i in over:
            self._check_length(encoded[i][0], fields[i], overflow)
        cut = encode([pairs[i] for i in over], limit, self._direction(body)) if over else []
        usage = _cuts_in_place(encoded, over, cut, fields)
        return [ids for ids, _ in encoded], [second for _, second in encoded], usage

    async def decisions(self, body: dict[str, Any]) -> dict[str, Any]:
        v.check_fields(body, allowed=_DECISIONS_FIELDS, required=("state", "questions"))
        model_name = self._served_model(body)
        state = v.text(body["state"], "state")
        questions = body["questions"]
        if not isinstance(questions, dict) or not questions:
            raise InvalidRequest("questions: expected a non-empty object of id -> question")
        if len(questions) > v.MAX_QUESTIONS:
            raise RequestTooLarge(
                f"questions: {len(questions)} entries; the limit is {v.MAX_QUESTIONS}"
            )
        texts: list[str] = []
        fields: list[str] = []
        layout: list[tuple[str, int, list[str]]] = []  # (id, query row, criterion keys)
        for qid, question in questions.items():
            where = f"questions.{qid}"
            if not isinstance(question, dict):
                raise InvalidRequest(f"{where}: expected an object")
            v.check_fields(
                question, allowed=_QUESTION_FIELDS, required=("type", "criteria"), where=f"{where}."
            )
            if question["type"] != "choice":
                raise InvalidRequest(f"{where}.type: expected 'choice'")
            query, query_field = state, "state"
            if "instructions" in question:
                instructions = v.text(question["instructions"], f"{where}.instructions")
                query, query_field = f"{instructions}\n{state}", f"{where} (instructions + state)"
            criteria = v.text_map(question["criteria"], f"{where}.criteria", limit=v.MAX_CRITERIA)
            layout.append((qid, len(texts), list(criteria)))
            texts.append(query)
            fields.append(query_field)
            texts.extend(criteria.values())
            fields.extend(f"{where}.criteria.{key}" for key in criteria)
        overflow = self._overflow(body)
        if overflow == "reject" and "state" not in fields:
            # Every query row is instructions + state; a state too long on its own must be
            # named as such, not blamed on the first question's instructions.
            (state_ids,) = await self._tokenize([state])
            self._check_length(state_ids, "state", overflow)
        rows, usage = await self._rows(texts, fields, overflow)
        vectors = await self.engine.compute("embed", rows)  # every question, one submission
        answers = {}
        for qid, query_row, keys in layout:
            query_vec = vectors[query_row]
            scores = [
                _cosine(query_vec, vectors[query_row + 1 + k]) / ZERO_SHOT_TEMPERATURE
                for k in range(len(keys))
            ]
            probabilities = _softmax(scores)
            best = max(range(len(keys)), key=probabilities.__getitem__)
            answers[qid] = {
                "type": "choice",
                "choice": keys[best],
                "probabilities": dict(zip(keys, probabilities, strict=True)),
                "confidence": probabilities[best],
            }
        return {"model": model_name, "answers": answers, "usage": usage}

    async def rerank(self, body: dict[str, Any]) -> dict[str, Any]:
        """Score each (query, document) pair with the checkpoint's cross-encoder head;
        results sorted by relevance, highest first (the shape Cohere, Jina and TEI rerank
        clients read)."""
        v.check_fields(body, allowed=_RERANK_FIELDS, required=("query", "documents"))
        model_name = self._served_model(body)
        query = v.text(body["query"], "query")
        given = body["documents"]
        documents, fields = v.documents(given, v.rank_field(body.get("rank_fields")))
        if body.get("max_chunks_per_doc") is not None:
            v.positive_int(body["max_chunks_per_doc"], "max_chunks_per_doc")  # not applied
        if body.get("max_tokens_per_doc") is not None:
            max_tokens_per_doc = v.positive_int(body["max_tokens_per_doc"], "max_tokens_per_doc")
            cut = functools.partial(
                first_tokens, self.model.tokenizer, documents, max_tokens_per_doc
            )
            if sum(map(len, documents)) > _INLINE_TOKENIZE_CHARS:
                documents = await trio.to_thread.run_sync(cut)
            else:
                documents = cut()
        top_n = v.positive_int(body["top_n"], "top_n") if "top_n" in body else len(documents)
        return_documents = v.boolean(body.get("return_documents", False), "return_documents")
        # The head's logit itself (TEI's raw_scores), not its sigmoid, which saturates.
        raw_scores = v.boolean(body.get("raw_scores", False), "raw_scores")
        labels = self.model.head_labels
        if self.token_classifier is not None:
            raise InvalidRequest(
                "this deployment's model labels tokens (a token-classification head); "
                "/v1/rerank needs a cross-encoder checkpoint (a *ForSequenceClassification "
                "with one output)"
            )
        if not labels:
            raise InvalidRequest(
                "this deployment's model has no classification head; /v1/rerank needs a "
                "cross-encoder checkpoint (a *ForSequenceClassification with one output)"
            )
        if len(labels) != 1:
            raise InvalidRequest(
                f"this deployment's model is a classifier with {len(labels)} labels; "
                "/v1/rerank needs a cross-encoder with one relevance output"
            )
        pairs, usage = await self._pairs(
            query, documents, fields, self._overflow(body), self._direction(body)
        )
        rows = [ids for ids, _ in pairs]
        logits = await self.engine.compute("rerank", rows, [second for _, second in pairs])
        scores = [row[0] if raw_scores else _sigmoids(row)[0] for row in logits]
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))[:top_n]
        results = []
        for index in order:
            result: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
            if return_documents:  # as given: a text as Cohere's and Jina's {text}
                document = given[index]
                result["document"] = document if isinstance(document, dict) else {"text": document}
            results.append(result)
        return {"model": model_name, "results": results, "usage": usage}

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await token_tasks.tokenize(self, body)

    async def token_embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        return await token_tasks.token_embeddings(self, body)

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await token_tasks.detokenize(self, body)

    async def _pairs(
        self, query: str, documents: list[str], fields: list[str], overflow: str, direction: str
    ) -> tuple[list[tuple[list[int], int]], dict]:
        """Each pair's ids and second-text start, under the overflow rule (a pair over
        the limit is refused, or cut longest text first as sentence-transformers'
        CrossEncoder cuts it), and the tokens in `usage`."""
        encode = self.model.encode_pairs
        characters = len(query) * len(documents) + sum(map(len, documents))
        timing.note_characters(characters)
        if characters > _INLINE_TOKENIZE_CHARS:
            pairs = await trio.to_thread.run_sync(encode, query, documents)
        else:
            pairs = encode(query, documents)
        limit = self.max_input_tokens
        over = [i for i, (ids, _) in enumerate(pairs) if len(ids) > limit]
        if over and overflow == "reject":
            i = over[0]
            raise InvalidRequest(
                f"{fields[i]}: {len(pairs[i][0])} tokens with the query {v.TOO_MANY_TOKENS} "
                f"{limit} (overflow: reject; send truncate: true to cut it "
                "instead)"
            )
        cut = []
        if over:
            try:
                cut = encode(query, [documents[i] for i in over], limit, direction)
            except Exception as error:  # tokenizers cannot cut this pair that short
                raise InvalidRequest(
                    f"{fields[over[0]]}: cannot be cut to input.max_tokens {limit}: {error}"
                ) from None
        return pairs, _cuts_in_place(pairs, over, cut, fields)

    async def _rows(
        self,
        texts: list[str],
        fields: list[str],
        overflow: str,
        cut: Callable[[list[int], int], list[int]] | None = None,
    ) -> tuple[list[list[int]], dict]:
        """Tokenize, apply the overflow rule per row, and account the tokens in `usage`."""
        return self._limit(await self._tokenize(texts), fields, overflow, cut)

    def _direction(self, body: dict[str, Any]) -> str:
        """Which end of an input too long is cut: `right` (the default) keeps its start,
        `left` its end (TEI's truncation_direction)."""
        direction = body.get("truncation_direction", "right")
        if direction not in ("right", "left"):
            raise InvalidRequest(
                f"truncation_direction: expected 'right' or 'left', got {direction!r}"
            )
        return direction

    def _cut(self, body: dict[str, Any]) -> Callable[[list[int], int], list[int]] | None:
        """How a row over the limit is cut: None (the model's own, from the right) unless
        the body asks for the left."""
        return self.model.truncate_left if self._direction(body) == "left" else None

    def _limit(
        self,
        rows: list[list[int]],
        fields: list[str],
        overflow: str,
        cut: Callable[[list[int], int], list[int]] | None = None,
    ) -> tuple[list[list[int]], dict]:
        """Apply the overflow rule per row and account the tokens in `usage`. Rows are cut
        by `cut` (default: the model's, which keeps the closing special tokens)."""
        limit = self.max_input_tokens
        cut = cut or self.model.truncate
        truncated: list[str] = []
        for index, ids in enumerate(rows):
            if len(ids) > limit:
                self._check_length(ids, fields[index], overflow)
                rows[index] = cut(ids, limit)
                truncated.append(fields[index])
        tokens = sum(map(len, rows))
        usage: dict[str, Any] = {"prompt_tokens": tokens, "total_tokens": tokens}
        if truncated:
            usage["truncated_inputs"] = truncated
        return rows, usage

    def _served_model(self, body: dict[str, Any]) -> str:
        """The model the answer names (sr.worker.served_as)."""
        return served_model(v.optional_model(body), self.artifact)

    def _overflow(self, body: dict[str, Any]) -> str:
        """The overflow rule for this request: its `truncate` (true: cut, false: refuse)
        overrides the deployment's `input.overflow`."""
        if "truncate" not in body:
            return self.overflow
        return "truncate" if v.boolean(body["truncate"], "truncate") else "reject"

    def _vocab_size(self) -> int:
        return self.model.backbone.vocab_size

    async def _tokenize(self, texts: list[str]) -> list[list[int]]:
        characters = sum(map(len, texts))
        timing.note_characters(characters)
        if characters > _INLINE_TOKENIZE_CHARS:
            return await trio.to_thread.run_sync(self.model.tokenize, texts)
        return self.model.tokenize(texts)

    def _check_length(self, ids: list[int], field: str, overflow: str) -> None:
        """Under overflow: reject, a row over the limit is the caller's error."""
        limit = self.max_input_tokens
        if len(ids) > limit and overflow == "reject":
            raise InvalidRequest(
                f"{field}: {len(ids)} tokens {v.TOO_MANY_TOKENS} {limit} (overflow: "
                "reject; send truncate: true to cut it instead)"
            )


def _cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm > 0.0 else 0.0


def _softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = math.fsum(exps)
    return [e / total for e in exps]


def _sigmoids(scores: list[float]) -> list[float]:
    """Each label's own probability (multi-label and single-logit heads)."""
    return [0.5 * (1.0 + math.tanh(0.5 * s)) for s in scores]  # no overflow at any score


def _shorten(vector: list[float], dimensions: int, normalize: bool) -> list[float]:
    """OpenAI's `dimensions`: the first `dimensions` values, back at unit length when the
    answer is to be (a checkpoint with a Normalize module, or `normalize: true`); else cut
    as they are."""
    head = vector[:dimensions]
    return _unit(head) if normalize else head


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0.0 else vector


def _head(ids: list[int], max_tokens: int) -> list[int]:
    return ids[:max_tokens]


def _tail(ids: list[int], max_tokens: int) -> list[int]:
    return ids[len(ids) - max_tokens :]


def _is_pair_list(value: Any) -> bool:
    """`input` of /v1/classify as text pairs: a list of [text, text_pair] lists."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], list)


def _base64_float32(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _cuts_in_place(
    pairs: list[tuple[list[int], int]], over: list[int], cut: list, fields: list[str]
) -> dict[str, Any]:
    """Puts each cut pair (`cut`, in the order of the indexes `over`) back in its place in
    `pairs`, and returns the tokens of them all as `usage`, naming the inputs that were cut."""
    for i, pair in zip(over, cut, strict=True):
        pairs[i] = pair
    tokens = sum(len(ids) for ids, _ in pairs)
    usage: dict[str, Any] = {"prompt_tokens": tokens, "total_tokens": tokens}
    if over:
        usage["truncated_inputs"] = [fields[i] for i in over]
    return usage
