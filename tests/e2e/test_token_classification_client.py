"""huggingface_hub's InferenceClient `token_classification` against a real `sr serve` on a
tiny BertForTokenClassification: the client posts `{inputs, parameters}` to the root URL,
sr routes it by the deployment's card (`head_task: token`) to /v1/classify, and the
entities equal transformers' token-classification pipeline's."""

from __future__ import annotations

import warnings

import huggingface_hub
import pytest

from tests.models.token_models import reference_pipeline, write_token_model
from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

TEXTS = ["My name is Wolfgang and I live in Berlin.", "Call +1 (555) 010-9999, Zoë!"]


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
    folder = write_token_model(tmp_path_factory.mktemp("ner-model") / "ner", "bert", seed=7)
    process = ServeProcess(tmp_path_factory.mktemp("ner-serve"), serve_config(folder, 1))
    process.folder = folder
    process.start(timeout_s=60)
    yield process
    process.stop()


def _pipeline(pipe, text, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipe(text, **options)


@pytest.mark.parametrize("strategy", ["simple", "first", "max"])
def test_inference_client_token_classification_matches_the_pipeline(ner, strategy):
    pipe = reference_pipeline(ner.folder)
    client = huggingface_hub.InferenceClient(model=ner.url, timeout=30)
    for text in TEXTS:
        got = client.token_classification(text, aggregation_strategy=strategy)
        want = _pipeline(pipe, text, aggregation_strategy=strategy)
        assert len(got) == len(want), (got, want)
        for mine, theirs in zip(got, want, strict=True):
            assert mine.entity_group == theirs["entity_group"]
            assert mine.word == theirs["word"]
            assert (mine.start, mine.end) == (theirs["start"], theirs["end"])
            assert abs(mine.score - float(theirs["score"])) <= 1e-5


def test_ignore_labels_and_errors_through_the_client(ner):
    pipe = reference_pipeline(ner.folder)
    client = huggingface_hub.InferenceClient(model=ner.url, timeout=30)
    got = client.token_classification(TEXTS[0], aggregation_strategy="none", ignore_labels=[])
    want = _pipeline(pipe, TEXTS[0], aggregation_strategy="none", ignore_labels=[])
    assert [(e.entity, e.start, e.end) for e in got] == [
        (e["entity"], e["start"], e["end"]) for e in want
    ]
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as raised:
        client.token_classification(TEXTS[0], stride=4)
    assert raised.value.response.status_code == 422
    assert raised.value.response.json()["error"].startswith("parameters.stride")
