"""/v1/token_embeddings (the last hidden state per token, before pooling) and
/v1/detokenize (ids back to text) on the worker, in process on the tiny checkpoint, against
the model's own hidden states and the tokenizer's decode."""

from __future__ import annotations

import pytest
from worker_fakes import post


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
