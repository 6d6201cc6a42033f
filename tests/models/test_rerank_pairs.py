"""Cross-encoder pairs against transformers: the tokenizer's pair template, token type 1 on
a BERT pair's second text, and the relevance logit within 1e-5 at float32; each pair
bit-identical alone and packed with pairs and single texts of other lengths."""

from __future__ import annotations

import pytest
import torch
import transformers

from sr.models import load_model
from tests.models.reference import VOCAB, reference_model, write_reference

TOLERANCE = 1e-5
QUERY = "how do rerankers score documents"
DOCUMENTS = [
    "A cross-encoder reads the query and the document together.",
    "bananas",
    "Rerankers " + "score each pair with one forward pass over both texts " * 6,
    "bananas",
]


def _bert():
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128, num_labels=1,
    )  # fmt: skip


def _xlm_roberta():
    return transformers.XLMRobertaConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=130, pad_token_id=1, num_labels=1,
    )  # fmt: skip


def _modernbert():
    return transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=256, local_attention=8,
        global_attn_every_n_layers=2, pad_token_id=0, num_labels=1,
    )  # fmt: skip


CONFIGS = {"bert": _bert, "xlm-roberta": _xlm_roberta, "modernbert": _modernbert}


@pytest.fixture(scope="module", params=list(CONFIGS))
def cross_encoder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"cross-{request.param}")
    write_reference(folder, CONFIGS[request.param](), head=True)
    return request.param, folder


def _reference_logits(folder, kind: str, query: str, documents: list[str]) -> torch.Tensor:
    """transformers' logits for each pair, encoded by transformers' own tokenizer (the
    pair template and token type ids it produces), each pair run alone."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = reference_model(folder, head=True)
    logits = []
    with torch.no_grad():
        for doc in documents:
            encoded = tokenizer(query, doc, return_tensors="pt")
            if kind != "bert":  # one token type (RoBERTa, ModernBERT): none is passed
                encoded.pop("token_type_ids", None)
            logits.append(model(**encoded).logits[0])
    return torch.stack(logits)


def test_pair_logits_match_transformers_with_its_pair_encoding(cross_encoder):
    kind, folder = cross_encoder
    model = load_model(folder)
    pairs = model.encode_pairs(QUERY, DOCUMENTS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for (ids, second), doc in zip(pairs, DOCUMENTS, strict=True):
        encoded = tokenizer(QUERY, doc)
        assert ids == encoded["input_ids"]
        if kind == "bert":
            assert encoded["token_type_ids"] == [0] * second + [1] * (len(ids) - second)
    got = model.rerank_logits([ids for ids, _ in pairs], [s for _, s in pairs])
    want = _reference_logits(folder, kind, QUERY, DOCUMENTS)
    assert got.shape == (len(DOCUMENTS), 1)
    assert (got - want).abs().max().item() <= TOLERANCE


def test_a_bert_pair_second_text_is_scored_at_token_type_one(tmp_path):
    # Scoring the same ids with every token at type 0 gives another logit: the type-1 rows
    # of the position table are what a BERT cross-encoder's second text needs.
    folder = write_reference(tmp_path / "bert", _bert(), head=True)
    model = load_model(folder)
    ((ids, second),) = model.encode_pairs(QUERY, DOCUMENTS[:1])
    as_pair = model.rerank_logits([ids], [second])
    as_one_text = model.rerank_logits([ids], [len(ids)])
    assert not torch.equal(as_pair, as_one_text)
    assert torch.equal(as_one_text, model.classify_logits([ids]))


def test_pairs_are_bit_identical_alone_and_packed_with_other_rows(cross_encoder):
    _, folder = cross_encoder
    model = load_model(folder)
    pairs = model.encode_pairs(QUERY, DOCUMENTS)
    single = model.tokenize(["a lone text of another length entirely, with more words"])[0]
    rows = [ids for ids, _ in pairs] + [single]
    starts = [s for _, s in pairs] + [len(single)]
    packed = model.rerank_logits(rows, starts)
    for index, (ids, second) in enumerate(pairs):
        alone = model.rerank_logits([ids], [second])
        assert torch.equal(alone[0], packed[index])
    # The single text in the same forward is scored as a single text.
    assert torch.equal(model.classify_logits([single])[0], packed[-1])


def test_pairs_cut_to_the_limit_match_transformers_longest_first_truncation(cross_encoder):
    _, folder = cross_encoder
    model = load_model(folder)
    limit = 24
    pairs = model.encode_pairs(QUERY, DOCUMENTS, truncate_to=limit)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for (ids, _), doc in zip(pairs, DOCUMENTS, strict=True):
        encoded = tokenizer(QUERY, doc, truncation="longest_first", max_length=limit)
        assert ids == encoded["input_ids"]
        assert len(ids) <= limit
