"""/v1/token_embeddings (the last hidden state per token, before pooling) and
/v1/detokenize (ids back to text) on the worker, in process on the tiny checkpoint, against
the model's own hidden states and the tokenizer's decode."""

from __future__ import annotations

import threading

import pytest
from worker_fakes import post

from sr.worker import service as service_module


async def test_token_embeddings_are_the_hidden_states_of_each_row(worker):
    texts = ["hello world", "a longer text of several words"]
    status, answer = await post(worker, "/v1/token_embeddings", {"input": texts})
    assert status == 200, answer
    model = worker.model
    rows = model.tokenize(texts)
    assert answer["usage"]["prompt_tokens"] == sum(map(len, rows))
    for row, entry in zip(rows, answer["data"], strict=True):
        assert len(entry["embeddings"]) == len(row)
        expected = model.token_states([row]).tolist()
        for got, want in zip(entry["embeddings"], expected, strict=True):
            assert got == pytest.approx(want, abs=1e-5)


async def test_detokenize_one_list_or_several(worker):
    tokenizer = worker.model.tokenizer
    rows = [tokenizer.encode(text).ids for text in ["hello world", "naïve café"]]
    status, answer = await post(worker, "/v1/detokenize", {"ids": rows})
    assert status == 200, answer
    assert [d["text"] for d in answer["data"]] == tokenizer.decode_batch(rows)
    status, one = await post(
        worker, "/v1/detokenize", {"ids": rows[0], "skip_special_tokens": False}
    )
    assert one["data"] == [
        {"index": 0, "text": tokenizer.decode(rows[0], skip_special_tokens=False)}
    ]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/detokenize", {"ids": []}, "ids"),
        ("/v1/detokenize", {"ids": [-1]}, "ids[0]"),
        ("/v1/detokenize", {"ids": [[1], "x"]}, "ids[1]"),
        ("/v1/detokenize", {"ids": [1], "skip": True}, "skip"),
        ("/v1/token_embeddings", {"input": ""}, "input"),
        ("/v1/token_embeddings", {"input": "a", "pooling": "none"}, "pooling"),
    ],
)
async def test_bad_bodies_name_the_field(worker, path, body, param):
    status, answer = await post(worker, path, body)
    assert status == 400 and answer["error"]["param"] == param, answer


async def test_a_large_answer_is_written_off_the_event_loop(worker, monkeypatch):
    """Thousands of per-token vectors take seconds to write as JSON: written on a helper
    thread, so the worker's /health (and every other request) is answered meanwhile. One
    short text's answer is written inline, on the event loop's thread."""
    writers: list[bool] = []
    encode = service_module._encode

    def recording(answer):
        writers.append(threading.current_thread() is threading.main_thread())
        return encode(answer)

    monkeypatch.setattr(service_module, "_encode", recording)
    status, _ = await post(worker, "/v1/token_embeddings", {"input": "hello world"})
    assert status == 200 and writers == [True]
    texts = [f"text number {i} of several words" for i in range(400)]
    tokens = sum(map(len, worker.model.tokenize(texts)))
    assert tokens * worker.model.backbone.hidden_size > service_module._INLINE_ANSWER_FLOATS
    status, large = await post(worker, "/v1/token_embeddings", {"input": texts})
    assert status == 200 and writers == [True, False]
    assert len(large["data"]) == 400 and large["usage"]["prompt_tokens"] == tokens
