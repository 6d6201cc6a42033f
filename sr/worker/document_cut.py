"""Cohere's `max_tokens_per_doc` on rerank: each document cut to its first n tokens before
it is paired with the query and scored, as Cohere's rerank does with long documents.

A document's tokens are counted alone, without the special tokens the pair template adds.
The cut is made in the text, after the character where its n-th token ends, so the pair is
then tokenized and held to `input.max_tokens` (the overflow rule) like any other pair;
cutting at a token's end gives back the same first n tokens. A cut document is not listed
in `usage.truncated_inputs`, which names the inputs cut to fit the model: the caller asked
for this one.
"""

from __future__ import annotations


def first_tokens(tokenizer, documents: list[str], max_tokens: int) -> list[str]:
    """Each document cut after its `max_tokens`-th token, unchanged when it has no more.
    `tokenizer`: a tokenizers.Tokenizer."""
    encodings = tokenizer.encode_batch(documents, add_special_tokens=False)
    return [
        document if len(encoding.ids) <= max_tokens
        else document[: encoding.offsets[max_tokens - 1][1]]
        for document, encoding in zip(documents, encodings, strict=True)
    ]  # fmt: skip
