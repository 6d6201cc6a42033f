"""Jina's and Infinity's fields on /v1/embeddings: honoured by their native equivalent,
refused naming the field where sr cannot honour the value; a field no peer defines stays
refused."""

from __future__ import annotations

import pytest
from worker_fakes import post

from sr.errors import InvalidRequest
from sr.worker.peer_fields import embeddings_body


def test_a_body_without_peer_fields_is_the_same_dict():
    body = {"input": "a"}
    assert embeddings_body(body) is body


@pytest.mark.parametrize(
    ("peer", "native"),
    [
        ({"embedding_type": "base64"}, {"encoding_format": "base64"}),
        ({"embedding_type": "float", "encoding_format": "float"}, {"encoding_format": "float"}),
        ({"normalized": False}, {"normalize": False}),
        ({"late_chunking": False}, {}),
        ({"modality": "text"}, {}),
    ],
)
def test_peer_fields_become_native_ones(peer, native):
    assert embeddings_body({"input": "a", **peer}) == {"input": "a", **native}


@pytest.mark.parametrize(
    ("peer", "field"),
    [
        ({"embedding_type": "binary"}, "embedding_type"),
        ({"embedding_type": "base64", "encoding_format": "float"}, "embedding_type"),
        ({"normalized": "yes"}, "normalized"),
        ({"normalized": True, "normalize": False}, "normalized"),
        ({"late_chunking": True}, "late_chunking"),
        ({"modality": "image"}, "modality"),
    ],
)
def test_values_sr_cannot_honour_are_refused(peer, field):
    with pytest.raises(InvalidRequest) as caught:
        embeddings_body({"input": "a", **peer})
    assert caught.value.param == field


async def test_on_the_worker(worker):
    _, plain = await post(worker, "/v1/embeddings", {"input": "hello", "encoding_format": "base64"})
    status, jina = await post(
        worker,
        "/v1/embeddings",
        {"input": "hello", "embedding_type": "base64", "late_chunking": False, "modality": "text"},
    )
    assert status == 200, jina
    assert jina["data"] == plain["data"]
    status, misspelt = await post(worker, "/v1/embeddings", {"input": "hello", "normalise": False})
    assert status == 400 and misspelt["error"]["param"] == "normalise"
