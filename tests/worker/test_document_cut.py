"""Cohere's `max_tokens_per_doc` cut (sr.worker.document_cut) on a real WordPiece tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from sr.models.artifacts import embedded_default_dir
from sr.worker.document_cut import first_tokens


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(embedded_default_dir() / "tokenizer.json"))
    tokenizer.no_padding()  # as the worker's model holds it (sr.models.encoder)
    tokenizer.no_truncation()
    return tokenizer


def test_a_document_keeps_exactly_its_first_n_tokens(tokenizer):
    documents = ["Invoices are listed under billing, monthly.", "short"]
    (cut, short) = first_tokens(tokenizer, documents, 3)
    whole = tokenizer.encode(documents[0], add_special_tokens=False).ids
    assert tokenizer.encode(cut, add_special_tokens=False).ids == whole[:3]
    assert documents[0].startswith(cut) and len(cut) < len(documents[0])
    assert short == "short"


def test_a_word_split_into_pieces_is_cut_between_them(tokenizer):
    (document,) = ["unbelievably"]
    pieces = tokenizer.encode(document, add_special_tokens=False).ids
    assert len(pieces) > 1  # the case under test: one word, several WordPiece tokens
    (cut,) = first_tokens(tokenizer, [document], 1)
    assert tokenizer.encode(cut, add_special_tokens=False).ids == pieces[:1]


def test_n_at_or_above_the_length_changes_nothing(tokenizer):
    documents = ["one two three", "four"]
    assert first_tokens(tokenizer, documents, 3) == documents
    assert first_tokens(tokenizer, documents, 100) == documents
