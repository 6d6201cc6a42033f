"""Token-classification heads (PII and NER detectors) against transformers, on tiny random
`*ForTokenClassification` checkpoints of BERT, RoBERTa, XLM-R and ModernBERT that
transformers itself wrote (tests/models/token_models.py):

- `token_logits` within 1e-5 of transformers' logits at float32, each row bit-identical
  alone and packed;
- the entities /v1/classify answers (sr.worker.tasks -> sr.worker.token_classify ->
  sr.worker.entities, the engine's forward replaced by the model's own) equal to
  transformers' `pipeline("token-classification")` for every aggregation strategy and for
  `ignore_labels`, on texts with subwords, punctuation, phone numbers, unknown characters,
  runs of spaces and non-ASCII letters;
- the head config.json's `architectures` names is the one loaded, and a class sr does not
  serve is refused in one line naming it.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
import transformers
from safetensors import safe_open

from sr.errors import UnsupportedModel
from sr.models import load_model
from sr.models.testing import write_sentence_transformers_modules
from sr.worker.entities import STRATEGIES
from sr.worker.tasks import Tasks
from tests.models.reference import random_rows
from tests.models.token_models import (
    FAMILIES,
    LABELS,
    reference_model,
    reference_pipeline,
    write_token_model,
)

TOLERANCE = 1e-5
SCORE_TOLERANCE = 1e-5
TEXTS = [
    "My name is Wolfgang and I live in Berlin.",
    "Sarah Jessica-Parker's e-mail: sarah@example.com (really?!)",
    "Call me at +1 (555) 010-9999 or 555.123.4567, ext. 42.",
    "hyperparameterization antidisestablishmentarianism",
    "an unknown ☃ snowman and 🙂 here",
    "   leading and  trailing   spaces   ",
    "Zoë Saldaña visited Zürich, İstanbul and 東京 in 2023.",
    "x",
]
UNKNOWN_TEXT = TEXTS[4]
LENGTHS = [1, 5, 5, 17, 40, 3, 17]


class _Engine:
    """The worker engine's `token` forward without its batching: the model's own, split
    back into rows (what sr.worker.engine answers for kind `token`)."""

    def __init__(self, model) -> None:
        self.model = model

    async def compute(self, kind: str, rows: list[list[int]]) -> list[list[list[float]]]:
        assert kind == "token"
        logits = self.model.token_logits(rows).tolist()
        answers, start = [], 0
        for row in rows:
            answers.append(logits[start : start + len(row)])
            start += len(row)
        return answers


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = write_token_model(tmp_path_factory.mktemp(request.param), request.param, seed=3)
    model = load_model(folder)
    tasks = Tasks(model, _Engine(model), artifact=str(folder), max_input_tokens=100,
                  overflow="reject")  # fmt: skip
    return request.param, folder, model, tasks, reference_pipeline(folder)


def _pipeline(pipe, text: str, **options) -> list[dict]:
    with warnings.catch_warnings():  # "Tokenizer does not support real words": expected
        warnings.simplefilter("ignore")
        return pipe(text, **options)


def assert_same_entities(got: list[dict], want: list[dict], what: str) -> None:
    """The same entities in the same order: every field exact but the score (~1e-5)."""
    assert len(got) == len(want), f"{what}: {got} != {want}"
    for position, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert set(mine) == set(theirs), f"{what} [{position}]: {mine} != {theirs}"
        for key, value in theirs.items():
            if key == "score":
                assert abs(mine[key] - float(value)) <= SCORE_TOLERANCE, f"{what} [{position}]"
            else:
                assert mine[key] == value, f"{what} [{position}] {key}: {mine} != {theirs}"


async def _entities(tasks: Tasks, texts: list[str], **fields) -> list[list[dict]]:
    answer = await tasks.classify({"input": texts, **fields})
    # Through JSON, as the worker answers.
    answer = json.loads(json.dumps(answer))
    assert [result["index"] for result in answer["results"]] == list(range(len(texts)))
    return [result["entities"] for result in answer["results"]]


# -- the head's logits ---------------------------------------------------------------------
def test_token_logits_match_transformers_and_rows_are_the_same_alone_and_packed(family):
    name, folder, model, _, pipe = family
    assert model.head_task == "token" and model.head_labels == list(LABELS)
    reference = reference_model(folder)
    vocab = reference.config.vocab_size
    texts = [model.tokenizer.encode(text).ids for text in TEXTS]
    for text, ids in zip(TEXTS, texts, strict=True):  # sr's tokenizer is the pipeline's
        assert ids == pipe.tokenizer(text)["input_ids"], text
    rows = texts + random_rows(LENGTHS, low=5, high=vocab)
    packed = model.token_logits(rows)
    assert packed.dtype == torch.float32 and packed.shape == (sum(map(len, rows)), len(LABELS))
    start = 0
    for row in rows:
        got = packed[start : start + len(row)]
        start += len(row)
        with torch.no_grad():
            want = reference(input_ids=torch.tensor([row])).logits[0]
        diff = (got - want).abs().max().item()
        assert diff <= TOLERANCE, f"{name}: row of {len(row)} tokens differs by {diff}"
        assert torch.equal(model.token_logits([row]), got), f"{name}: alone != packed"


def test_the_texts_reach_the_cases_they_are_for(family):
    """Several labels win, groups merge, and the unknown-token rule is exercised."""
    name, _, model, _, pipe = family
    tokens = [e for text in TEXTS for e in _pipeline(pipe, text, ignore_labels=[])]
    assert len({e["entity"] for e in tokens}) >= 4, f"{name}: labels hardly vary"
    for strategy in ("simple", "first"):  # some groups hold several tokens
        groups = [
            e for text in TEXTS
            for e in _pipeline(pipe, text, aggregation_strategy=strategy, ignore_labels=[])
        ]  # fmt: skip
        assert len(groups) < len(tokens), f"{name} {strategy}: no group merges tokens"
    if name != "roberta":  # a byte-level BPE has no unknown token
        ids = model.tokenizer.encode(UNKNOWN_TEXT).ids
        assert pipe.tokenizer.unk_token_id in ids


# -- entities against transformers' pipeline ----------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_entities_match_the_pipeline(family, strategy):
    name, _, _, tasks, pipe = family
    got = await _entities(tasks, TEXTS, aggregation_strategy=strategy)
    for text, mine in zip(TEXTS, got, strict=True):
        want = _pipeline(pipe, text, aggregation_strategy=strategy)
        assert_same_entities(mine, want, f"{name} {strategy} {text!r}")
        for entity in mine:  # offsets are code points into the caller's text
            assert 0 <= entity["start"] <= entity["end"] <= len(text)


async def test_one_text_and_the_default_strategy_is_simple(family):
    name, _, _, tasks, pipe = family
    (got,) = await _entities(tasks, [TEXTS[0]])
    assert_same_entities(got, _pipeline(pipe, TEXTS[0], aggregation_strategy="simple"), name)
    answer = await tasks.classify({"input": TEXTS[0], "aggregation_strategy": "MAX"})
    want = _pipeline(pipe, TEXTS[0], aggregation_strategy="max")
    assert_same_entities(answer["results"][0]["entities"], want, f"{name} MAX")


@pytest.mark.parametrize("strategy", ["none", "simple", "first"])
@pytest.mark.parametrize(
    "ignore", [[], ["O", "B-PER"], ["PER", "PHONE"], ["I-LOC", "LOC", "unknown"]]
)
async def test_ignore_labels_match_the_pipeline(family, strategy, ignore):
    name, _, _, tasks, pipe = family
    got = await _entities(tasks, TEXTS, aggregation_strategy=strategy, ignore_labels=ignore)
    for text, mine in zip(TEXTS, got, strict=True):
        want = _pipeline(pipe, text, aggregation_strategy=strategy, ignore_labels=ignore)
        assert_same_entities(mine, want, f"{name} {strategy} ignore={ignore} {text!r}")


LONG = "Zoë met Wolfgang in Zürich, and Sarah called 555 010 9999 from Paris on Monday. " * 3


async def test_a_cut_text_answers_the_entities_of_the_tokens_kept(family):
    """Over max_input_tokens with overflow truncate, a row keeps its first tokens and its
    closing special tokens: its entities are the pipeline's on the text those tokens
    cover, at the same offsets (where that text tokenizes to the same tokens)."""
    name, folder, model, _, pipe = family
    encoding = model.tokenizer.encode(LONG)
    closing = len(model.tokenizer.encode("").ids) - 1
    checked = 0
    for limit in range(8, 40):
        if checked == 3:
            break
        content = limit - 1 - closing  # tokens of the text kept after the opening one
        covered = LONG[: encoding.offsets[content][1]]
        kept = [*encoding.ids[: limit - closing], *encoding.ids[len(encoding.ids) - closing :]]
        if pipe.tokenizer(covered)["input_ids"] != kept:
            continue  # cut inside a word: that text is not one of its own
        tasks = Tasks(model, _Engine(model), artifact=str(folder), max_input_tokens=limit,
                      overflow="truncate")  # fmt: skip
        for strategy in ("none", "simple", "first"):
            answer = await tasks.classify(
                {"input": [LONG], "aggregation_strategy": strategy, "ignore_labels": []}
            )
            assert answer["usage"]["truncated_inputs"] == ["input[0]"]
            assert answer["usage"]["prompt_tokens"] == limit
            want = _pipeline(pipe, covered, aggregation_strategy=strategy, ignore_labels=[])
            got = answer["results"][0]["entities"]
            assert_same_entities(got, want, f"{name} {strategy} cut at {limit}")
        checked += 1
    assert checked >= 3, f"{name}: too few cuts at a word's end"


# -- which head a folder is served with ------------------------------------------------------
def _architectures(folder, names) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = names
    path.write_text(json.dumps(config))


def test_bert_token_classification_folder_loads_the_token_head(tmp_path):
    """transformers' BertForTokenClassification has no pooler: named by `architectures`, it
    loads its per-token `classifier`, never the sequence head (pooler + classifier)."""
    folder = write_token_model(tmp_path / "bert", "bert")
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "BertForTokenClassification"
    ]
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "classifier.weight" in names and not any("pooler" in n for n in names)
    model = load_model(folder)
    assert model.head_task == "token" and model.head_activation == "softmax"
    assert model.head_labels == list(LABELS)


def test_modernbert_token_folder_is_never_a_sequence_classifier(tmp_path):
    """A ModernBERT token head holds the same tensors as its sequence head (`head.*`,
    `classifier.*`): only `architectures` tells them apart."""
    folder = write_token_model(tmp_path / "modernbert", "modernbert")
    model = load_model(folder)
    assert model.head_task == "token"
    ids = model.tokenizer.encode(TEXTS[0]).ids
    assert model.token_logits([ids]).shape == (len(ids), len(LABELS))
    # Named as a sequence classifier, the same tensors load the sequence head instead.
    _architectures(folder, ["ModernBertForSequenceClassification"])
    assert load_model(folder).head_task == "sequence"


def test_the_named_bare_model_loads_no_head(tmp_path):
    folder = write_token_model(tmp_path / "bert", "bert")
    _architectures(folder, ["BertModel"])
    model = load_model(folder)
    assert model.head_task is None and model.head_labels is None


@pytest.mark.parametrize("family_name", ["bert", "xlm-roberta", "modernbert"])
def test_an_unsupported_class_is_refused_in_one_line_naming_it(tmp_path, family_name):
    folder = write_token_model(tmp_path / family_name, family_name)
    prefix = {"bert": "Bert", "xlm-roberta": "XLMRoberta", "modernbert": "ModernBert"}
    unsupported = f"{prefix[family_name]}ForMaskedLM"
    _architectures(folder, [unsupported])
    with pytest.raises(UnsupportedModel) as raised:
        load_model(folder)
    message = str(raised.value)
    assert unsupported in message and "\n" not in message
    assert f"{prefix[family_name]}ForTokenClassification" in message  # what is supported


def test_bert_masked_lm_without_modules_json_is_refused(tmp_path):
    """A real BertForMaskedLM folder (saved by transformers) is refused naming its class;
    with a sentence-transformers modules.json its bare model is served (as
    sentence-transformers itself loads it)."""
    folder = tmp_path / "mlm"
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertForMaskedLM(config).save_pretrained(folder, safe_serialization=True)
    source = write_token_model(tmp_path / "source", "bert")
    shutil.copyfile(source / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(UnsupportedModel) as raised:
        load_model(folder)
    message = str(raised.value)
    assert "'BertForMaskedLM'" in message and "\n" not in message
    write_sentence_transformers_modules(folder, 32, 64)
    model = load_model(folder)
    assert model.head_task is None and model.head_labels is None


def test_several_heads_named_at_once_are_refused(tmp_path):
    folder = write_token_model(tmp_path / "bert", "bert")
    _architectures(folder, ["BertForTokenClassification", "BertForSequenceClassification"])
    with pytest.raises(UnsupportedModel, match="several heads"):
        load_model(folder)
