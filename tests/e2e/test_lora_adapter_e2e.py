"""`sr serve` as a real process with two LoRA adapter deployments of one tiny BERT
classifier (one adapter by path, one by repository ID under SR_MODEL_DIR, whose base is
an ID there too): each worker answers /v1/classify with peft's probabilities, and the
router's model entry shows the adapter and its base as the worker's card gives them."""

from __future__ import annotations

import hashlib

import peft
import pytest
import torch
import transformers

from tests.models.reference import VOCAB, write_reference
from tests.models.test_lora_adapter import peft_logits, write_adapter
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.e2e

LABELS = {0: "billing", 1: "greeting", 2: "complaint"}
TEXTS = ["please send the invoice again", "hi!", "this is the third time I write"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    models = tmp_path_factory.mktemp("lora-e2e-models")
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=3, id2label=LABELS,
    )  # fmt: skip
    base = write_reference(models / "acme" / "intent-bert", config, head=True, seed=11)
    intent = write_adapter(
        base, models / "intent-lora",
        peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"]),
        seed=12,
    )  # fmt: skip
    guard = write_adapter(
        base, models / "acme" / "guard-lora",
        peft.LoraConfig(task_type="SEQ_CLS", r=2, lora_alpha=4, use_rslora=True,
                        target_modules=r".*\.(key|dense)"),
        seed=13, base_name="acme/intent-bert",
    )  # fmt: skip
    deployments = {
        "intent": {"artifact": str(intent), "replicas": [{"device": "cpu"}]},
        "guard": {"artifact": "acme/guard-lora", "replicas": [{"device": "cpu"}]},
    }
    process = ServeProcess(
        tmp_path_factory.mktemp("lora-e2e"),
        {
            "global": {
                "model_catalog": {
                    "deployments": deployments,
                    "system": {"decision_model": {"deployment": "intent"}},
                }
            },
            "listeners": [{"host": "127.0.0.1", "port": 8899}],
        },
        env={"SR_MODEL_DIR": str(models)},
    )
    process.start(timeout_s=90)
    yield process, base, {"intent": intent, "guard": guard}
    process.stop()


@pytest.mark.parametrize("name", ["intent", "guard"])
def test_an_adapter_deployment_classifies_with_peft_probabilities(served, name):
    process, base, adapters = served
    answer = process.client.post("/v1/classify", json={"model": name, "input": TEXTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == name
    # peft's model on the tokenizer's ids, each text alone.
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(base / "tokenizer.json"))
    rows = [tokenizer(text)["input_ids"] for text in TEXTS]
    want = torch.softmax(peft_logits(base, adapters[name], rows), dim=1)
    other = process.client.post("/v1/classify", json={"model": "intent", "input": TEXTS}).json()
    for result, row in zip(body["results"], want.tolist(), strict=True):
        assert list(result["probabilities"]) == list(LABELS.values())
        assert list(result["probabilities"].values()) == pytest.approx(row, abs=1e-5)
        assert result["label"] == LABELS[max(range(3), key=row.__getitem__)]
    if name == "guard":  # two adapters of one base answer as themselves
        assert body["results"] != other["results"]


def test_the_model_entry_shows_the_adapter_and_its_base(served):
    process, base, adapters = served

    def digest(path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    entry = process.client.get("/v1/models/guard").json()
    assert entry["artifact"] == "acme/guard-lora"
    adapter = entry["adapter"]
    assert adapter["path"] == str(adapters["guard"].resolve())
    assert adapter["weights_sha256"] == digest(adapters["guard"] / "adapter_model.safetensors")
    assert (adapter["r"], adapter["use_rslora"], adapter["scale"]) == (2, True, 4 / 2**0.5)
    assert adapter["base"] == {
        "artifact": "acme/intent-bert",
        "revision": None,
        "path": str(base.resolve()),
        "weights_sha256": digest(base / "model.safetensors"),
    }
    intent = process.client.get("/v1/models/intent").json()["adapter"]
    assert intent["base"]["artifact"] == str(base)
    assert intent["base"]["weights_sha256"] == adapter["base"]["weights_sha256"]
