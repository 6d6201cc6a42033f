"""TEI's task routes beyond embed and rerank, and Hugging Face's task shapes on the root
route: each body as a native worker request and the worker's native answer in the task's
shape. Pure, like sr.router.tei, which routes to them.

    POST /similarity  {inputs: {source_sentence, sentences}, parameters?} -> /v1/embeddings
                      of [source, *sentences], normalised (`parameters.prompt_name`: the
                      native one, before every text); answered [cosine, ...], one per
                      sentence (sentence-transformers' cos_sim)
    POST /predict     {inputs, truncate?, truncation_direction?, raw_scores?} -> /v1/classify;
                      `inputs` is a text, a pair [text, text_pair], or a list of either (TEI
                      reads a list of exactly two strings as one pair); answered
                      [{score, label}, ...] highest first, a list of such lists for a batch
    POST / (a sequence-classification deployment, `inputs` texts): Hugging Face's
                      text-classification task, `{inputs, parameters?: {top_k,
                      function_to_apply}}` -> /v1/classify; answered [[{label, score}, ...]]
                      per input, highest first
    POST / (a token-classification deployment): Hugging Face's token-classification task
                      (see sr.router.tei)
"""

from __future__ import annotations

import json
import math
from typing import Any

from sr.errors import EmptyInput, InvalidRequest
from sr.http.jsonbody import dump_json, json_kind
from sr.router.tei_fields import flag, prompt, text, texts, truncation
from sr.worker.validation import check_fields

SIMILARITY, PREDICT = "/similarity", "/predict"
TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION = "text-classification", "token-classification"

NATIVE_ROUTE = {
    SIMILARITY: "/v1/embeddings",
    PREDICT: "/v1/classify",
    TEXT_CLASSIFICATION: "/v1/classify",
    TOKEN_CLASSIFICATION: "/v1/classify",
}
FIELDS = {
    SIMILARITY: frozenset({"inputs", "parameters", "model"}),
    PREDICT: frozenset({"inputs", "truncate", "truncation_direction", "raw_scores", "model"}),
    TEXT_CLASSIFICATION: frozenset({"inputs", "parameters", "model"}),
    TOKEN_CLASSIFICATION: frozenset({"inputs", "parameters", "model"}),
}
_SIMILARITY_INPUTS = ("source_sentence", "sentences")
_SIMILARITY_PARAMETERS = frozenset({"truncate", "truncation_direction", "prompt_name"})
_TEXT_PARAMETERS = frozenset({"top_k", "function_to_apply"})
_FUNCTIONS = ("sigmoid", "softmax", "none")
_TOKEN_PARAMETERS = frozenset({"aggregation_strategy", "ignore_labels", "stride"})


# -- /similarity ---------------------------------------------------------------------------
def similarity_body(body: dict[str, Any]) -> dict[str, Any]:
    inputs = body["inputs"]
    if not isinstance(inputs, dict):
        raise InvalidRequest(
            f"inputs: expected an object {{source_sentence, sentences}}, got {json_kind(inputs)}"
        )
    check_fields(
        inputs,
        allowed=_SIMILARITY_INPUTS,
        required=_SIMILARITY_INPUTS,
        route="inputs of /similarity",
    )
    source = text(inputs["source_sentence"], "inputs.source_sentence")
    sentences = inputs["sentences"]
    if not isinstance(sentences, list):
        raise InvalidRequest(
            f"inputs.sentences: expected a list of strings, got {json_kind(sentences)}"
        )
    if not sentences:
        raise EmptyInput("inputs.sentences: must not be empty")
    others = [text(item, f"inputs.sentences[{i}]") for i, item in enumerate(sentences)]
    native: dict[str, Any] = {"input": [source, *others], "normalize": True}
    parameters = _parameters(body, _SIMILARITY_PARAMETERS)
    native.update(truncation(parameters))
    native.update(prompt(parameters))  # the folder's prompt before each text
    return native


def similarity_answer(native: dict[str, Any]) -> bytes:
    rows = sorted(native["data"], key=lambda row: row["index"])
    source, *others = (row["embedding"] for row in rows)
    return dump_json([_cosine(source, other) for other in others])


def _cosine(a: list[float], b: list[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm > 0.0 else 0.0


# -- /predict and the text-classification task ---------------------------------------------
def predict_body(body: dict[str, Any]) -> dict[str, Any]:
    """TEI's PredictInput: a text, a pair, or a list of texts or pairs."""
    inputs = body["inputs"]
    if _is_pair(inputs) or isinstance(inputs, str):
        items: list[Any] = [inputs]
    elif isinstance(inputs, list):
        if not inputs:
            raise EmptyInput("inputs: must not be empty")
        items = inputs
    else:
        raise InvalidRequest(
            f"inputs: expected a text, a pair [text, text_pair] or a list of them, "
            f"got {json_kind(inputs)}"
        )
    rows: list[Any] = []
    for index, item in enumerate(items):
        field = f"inputs[{index}]" if len(items) > 1 or items is inputs else "inputs"
        if isinstance(item, str):
            rows.append(text(item, field))
        elif _is_pair(item):
            rows.append([text(item[0], f"{field}[0]"), text(item[1], f"{field}[1]")])
        else:
            raise InvalidRequest(
                f"{field}: expected a text or a pair of texts, got {json_kind(item)}"
            )
    kinds = {isinstance(row, str) for row in rows}
    if len(kinds) > 1:
        raise InvalidRequest("inputs: a batch is all texts or all pairs")
    native: dict[str, Any] = {"input": rows, "raw_scores": flag(body, "raw_scores", False)}
    native.update(truncation(body))
    return native


def predict_single(body: dict[str, Any]) -> bool:
    """Whether a /predict body is one input (answered as one list, not a list of lists)."""
    inputs = body["inputs"]
    return isinstance(inputs, str) or _is_pair(inputs)


def predict_answer(native: dict[str, Any], single: bool) -> bytes:
    answers = [
        [{"score": score, "label": label} for label, score in _ranked(result["probabilities"])]
        for result in sorted(native["results"], key=lambda result: result["index"])
    ]
    return dump_json(answers[0] if single else answers)


def text_classification_body(body: dict[str, Any]) -> dict[str, Any]:
    native: dict[str, Any] = {"input": texts(body["inputs"])}
    parameters = _parameters(body, _TEXT_PARAMETERS)
    function = parameters.get("function_to_apply")
    if function is not None:
        if function not in _FUNCTIONS:
            raise InvalidRequest(
                f"parameters.function_to_apply: expected one of {', '.join(_FUNCTIONS)}, "
                f"got {function!r}"
            )
        native["raw_scores"] = True  # the function is applied to the logits here
    top_k = parameters.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise InvalidRequest(f"parameters.top_k: expected an integer >= 1, got {top_k!r}")
    return native


def text_classification_answer(native: dict[str, Any], body: dict[str, Any]) -> bytes:
    parameters = body.get("parameters") or {}
    function, top_k = parameters.get("function_to_apply"), parameters.get("top_k")
    answers = []
    for result in sorted(native["results"], key=lambda result: result["index"]):
        scores = result["probabilities"]
        if function is not None:
            scores = _apply(function, scores)
        ranked = _ranked(scores)[: top_k or None]
        answers.append([{"label": label, "score": score} for label, score in ranked])
    return dump_json(answers)


def _apply(function: str, logits: dict[str, float]) -> dict[str, float]:
    """transformers' text-classification `function_to_apply` on a row of logits."""
    if function == "sigmoid":
        return {k: 0.5 * (1.0 + math.tanh(0.5 * v)) for k, v in logits.items()}
    if function == "softmax":
        top = max(logits.values())
        exps = {k: math.exp(v - top) for k, v in logits.items()}
        total = math.fsum(exps.values())
        return {k: e / total for k, e in exps.items()}
    return logits


def _ranked(scores: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda item: -item[1])


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


# -- the token-classification task ---------------------------------------------------------
def token_classification_body(body: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face's token-classification task body as the native /v1/classify's."""
    native: dict[str, Any] = {"input": texts(body["inputs"])}
    for name, value in _parameters(body, _TOKEN_PARAMETERS).items():
        if name == "stride":
            if value is not None:
                raise InvalidRequest(
                    "parameters.stride: not supported; sr classifies each text in one window "
                    "(a text over input.max_tokens follows the deployment's input.overflow)"
                )
        elif value is not None:
            native[name] = value  # the worker checks them, naming the native field
    return native


def token_classification_answer(native: dict[str, Any], body: dict[str, Any]) -> bytes:
    results = sorted(native["results"], key=lambda result: result["index"])
    if isinstance(body["input"], str):
        return dump_json(results[0]["entities"])
    return dump_json([result["entities"] for result in results])


def _parameters(body: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    parameters = body.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"parameters: expected an object, got {json_kind(parameters)}")
    for name in parameters:
        if name not in allowed:
            raise InvalidRequest(
                f"parameters.{name}: unknown parameter; allowed: {', '.join(sorted(allowed))}"
            )
    return parameters


def answer(task: str, request_body: dict[str, Any], caller_body: dict[str, Any],
           payload: bytes) -> bytes:  # fmt: skip
    """The worker's native answer to a task request in the task's shape."""
    native = json.loads(payload)
    if task == SIMILARITY:
        return similarity_answer(native)
    if task == PREDICT:
        return predict_answer(native, predict_single(caller_body))
    if task == TEXT_CLASSIFICATION:
        return text_classification_answer(native, caller_body)
    return token_classification_answer(native, request_body)
