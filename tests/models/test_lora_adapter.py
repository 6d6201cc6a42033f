"""LoRA adapters (sr.models.adapter) against peft on tiny random models.

Each base is a transformers model saved with `save_pretrained` (tests/models/reference.py);
each adapter is made by peft's own `get_peft_model(LoraConfig(...))` with every lora_A,
lora_B and saved module set to random values (peft starts B at zero, which would hide a
wrong merge) and saved with peft's `save_pretrained`. The reference is peft's
`PeftModel.from_pretrained` on the base, unmerged (x W^T + scale x A^T B^T), each row run
alone; sr merges at load and must agree within 1e-5 at float32. Every comparison also
checks that the adapter moves the answer far more than that (`assert_adapter_matters`),
so a merge that dropped the scale or a module could not pass.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import peft
import pytest
import torch
import transformers

from sr.errors import ArtifactNotFound, UnsupportedModel
from sr.models import load_model
from sr.models.artifacts import resolve_artifact
from sr.models.lora_config import read_lora_config
from tests.models.reference import VOCAB, random_rows, sr_hidden, write_reference

TOLERANCE = 1e-5
LENGTHS = [1, 5, 5, 17, 40, 3]
# The adapter must move the logits this much more than the tolerance: a merge that is
# wrong by its scale or a module lands far outside it.
MOVES_AT_LEAST = 1e-2
LABELS = {0: "billing", 1: "greeting", 2: "complaint"}


def bert_config(**extra):
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=3, **extra,
    )  # fmt: skip


def roberta_config():
    return transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=130, num_labels=2, pad_token_id=1,
    )  # fmt: skip


def modernbert_config():
    # local_attention=8: the rows of 17 and 40 tokens meet the window on the local layer.
    return transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=256, local_attention=8,
        global_attn_every_n_layers=2, pad_token_id=0, num_labels=3,
    )  # fmt: skip


def _quiet():
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="peft")
    warnings.filterwarnings("ignore", category=FutureWarning)


def _task_model(base: Path, head: bool, num_labels: int | None = None):
    _quiet()
    kind = transformers.AutoModelForSequenceClassification if head else transformers.AutoModel
    extra = {} if num_labels is None else {"num_labels": num_labels}
    return kind.from_pretrained(base, attn_implementation="eager", dtype=torch.float32, **extra)


def write_adapter(
    base: Path, folder: Path, lora: peft.LoraConfig, *, head: bool = True, seed: int = 1,
    num_labels: int | None = None, base_name: str | None = None,
) -> Path:  # fmt: skip
    """peft's adapter of `base` with random lora_A / lora_B (and saved modules, and the
    biases `bias` trains), saved by peft; `base_name` rewrites base_model_name_or_path."""
    model = peft.get_peft_model(_task_model(base, head, num_labels), lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.copy_(noise * 0.2)
    model.save_pretrained(folder)
    if base_name is not None:
        edit_config(folder, base_model_name_or_path=base_name)
    return folder


def edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def peft_model(base: Path, adapter: Path, *, head: bool = True, num_labels: int | None = None):
    return peft.PeftModel.from_pretrained(_task_model(base, head, num_labels), adapter).eval()


def peft_logits(base: Path, adapter: Path, rows, num_labels: int | None = None) -> torch.Tensor:
    model = peft_model(base, adapter, num_labels=num_labels)
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])


def peft_hidden(base: Path, adapter: Path, rows) -> list[torch.Tensor]:
    model = peft_model(base, adapter, head=False)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([row])).last_hidden_state[0] for row in rows]


def base_logits(base: Path, rows) -> torch.Tensor:
    model = _task_model(base, True).eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])


def assert_adapter_matters(with_adapter: torch.Tensor, without: torch.Tensor) -> None:
    assert (with_adapter - without).abs().max().item() > MOVES_AT_LEAST


def check_logits(base: Path, adapter: Path, rows, num_labels: int | None = None) -> float:
    """sr's logits of the adapter deployment within TOLERANCE of peft's; the max diff."""
    model = load_model(adapter)
    got = model.classify_logits(rows)
    want = peft_logits(base, adapter, rows, num_labels)
    diff = (got - want).abs().max().item()
    assert diff <= TOLERANCE, diff
    # Bit-identical alone and packed, as any sr model.
    for index, row in enumerate(rows):
        assert torch.equal(model.classify_logits([row])[0], got[index])
    return diff


@pytest.fixture(scope="module")
def bert_base(tmp_path_factory) -> Path:
    return write_reference(tmp_path_factory.mktemp("lora") / "bert", bert_config(), head=True)


@pytest.fixture(scope="module")
def roberta_base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lora") / "roberta"
    return write_reference(folder, roberta_config(), head=True, seed=2)


@pytest.fixture(scope="module")
def modernbert_base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lora") / "modernbert"
    return write_reference(folder, modernbert_config(), head=True, seed=3)


@pytest.fixture(scope="module")
def rows():
    return random_rows(LENGTHS, seed=4)


# ---- what is served, against peft -------------------------------------------------------


@pytest.mark.parametrize("rslora", [False, True], ids=["alpha-over-r", "rslora"])
def test_bert_target_modules_as_a_list(bert_base, tmp_path, rows, rslora):
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, use_rslora=rslora,
        target_modules=["query", "value"],
    )  # fmt: skip
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    check_logits(bert_base, adapter, rows)
    model = load_model(adapter)
    # 2 layers x (query, value); the classifier (peft adds it to modules_to_save) whole.
    assert model.adapter.merged == [
        f"bert.encoder.layer.{i}.attention.self.{n}" for i in (0, 1) for n in ("query", "value")
    ]
    assert model.adapter.replaced == ["classifier.bias", "classifier.weight"]
    assert model.adapter.scales == {8 / 2 if rslora else 8 / 4}
    assert_adapter_matters(model.classify_logits(rows), base_logits(bert_base, rows))


@pytest.mark.parametrize("rslora", [False, True], ids=["alpha-over-r", "rslora"])
def test_roberta_target_modules_as_a_regex(roberta_base, tmp_path, rows, rslora):
    # `.*\.dense` also fullmatches classifier.dense: peft leaves a module of
    # modules_to_save (the classifier, saved whole) without LoRA, and so must sr.
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=16, use_rslora=rslora,
        target_modules=r".*\.(query|key|dense)",
    )  # fmt: skip
    adapter = write_adapter(roberta_base, tmp_path / "adapter", lora)
    check_logits(roberta_base, adapter, rows)
    model = load_model(adapter)
    assert len(model.adapter.merged) == 2 * 5  # query, key and three dense per layer
    assert not any(name.startswith("classifier") for name in model.adapter.merged)
    assert "classifier.out_proj.weight" in model.adapter.replaced
    assert_adapter_matters(model.classify_logits(rows), base_logits(roberta_base, rows))


def test_modernbert_fused_wqkv(modernbert_base, tmp_path, rows):
    # Wqkv is one fused [3H, H] layer in ModernBERT: LoRA on it is one B @ A over q, k, v.
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["Wqkv", "Wi"])
    adapter = write_adapter(modernbert_base, tmp_path / "adapter", lora)
    check_logits(modernbert_base, adapter, rows)
    model = load_model(adapter)
    assert "model.layers.0.attn.Wqkv" in model.adapter.merged
    assert len(model.adapter.merged) == 3 * 2
    assert_adapter_matters(model.classify_logits(rows), base_logits(modernbert_base, rows))


def test_all_linear_and_patterns(modernbert_base, tmp_path, rows):
    # "all-linear": every linear layer but the output classifier (peft's expansion), with a
    # rank and an alpha of their own on the attention output layers.
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules="all-linear",
        rank_pattern={"attn.Wo": 2}, alpha_pattern={"attn.Wo": 6},
    )  # fmt: skip
    adapter = write_adapter(modernbert_base, tmp_path / "adapter", lora)
    check_logits(modernbert_base, adapter, rows)
    model = load_model(adapter)
    assert len(model.adapter.merged) == 3 * 4 + 1  # Wqkv, Wo, Wi, Wo per layer; head.dense
    assert model.adapter.scales == {2.0, 3.0}


def test_layers_to_transform_exclude_modules_lora_bias_and_trained_biases(
    bert_base, tmp_path, rows
):
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "key", "dense"],
        layers_to_transform=[1], exclude_modules=["attention.output.dense"],
        lora_bias=True, bias="all",
    )  # fmt: skip
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    check_logits(bert_base, adapter, rows)
    merged = load_model(adapter).adapter.merged
    assert merged == [
        f"bert.encoder.layer.1.{n}"
        for n in ("attention.self.key", "attention.self.query", "intermediate.dense",
                  "output.dense")
    ]  # fmt: skip


def test_bias_lora_only(bert_base, tmp_path, rows):
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["value"], bias="lora_only"
    )
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    check_logits(bert_base, adapter, rows)
    assert "encoder.layer.0.attention.self.value.bias" in load_model(adapter).adapter.replaced


def test_fan_in_fan_out_is_treated_as_peft_treats_it_on_linear_layers(bert_base, tmp_path, rows):
    # peft sets fan_in_fan_out false for torch.nn.Linear (every layer of sr's families),
    # with a warning; an adapter_config.json that says true is served as peft serves it.
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    edit_config(adapter, fan_in_fan_out=True)
    assert read_lora_config(adapter).fan_in_fan_out is True
    check_logits(bert_base, adapter, rows)


def test_a_classifier_from_modules_to_save_on_a_base_without_one(tmp_path, rows):
    # The base is a bare BertModel (no `bert.` prefix, no classifier): peft's model was
    # BertForSequenceClassification built on it, whose classifier the adapter saves whole.
    base = write_reference(tmp_path / "bert-model", bert_config(), head=False, seed=6)
    lora = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query", "value"],
        modules_to_save=["classifier"],
    )  # fmt: skip
    adapter = write_adapter(base, tmp_path / "adapter", lora, num_labels=3)
    check_logits(base, adapter, rows, num_labels=3)
    model = load_model(adapter)
    assert model.head_labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    # Labels from the adapter folder's own config.json, when it has one.
    (adapter / "config.json").write_text(
        json.dumps({"model_type": "bert", "id2label": {str(k): v for k, v in LABELS.items()}})
    )
    assert load_model(adapter).head_labels == list(LABELS.values())


def test_feature_extraction_on_a_bare_bert_model(tmp_path):
    base = write_reference(tmp_path / "bert-model", bert_config(), head=False, seed=7)
    lora = peft.LoraConfig(
        task_type="FEATURE_EXTRACTION", r=4, lora_alpha=8,
        target_modules=["query", "value", "intermediate.dense"],
    )  # fmt: skip
    adapter = write_adapter(base, tmp_path / "adapter", lora, head=False)
    rows = random_rows(LENGTHS, seed=8)
    model = load_model(adapter)
    want = peft_hidden(base, adapter, rows)
    got = sr_hidden(model, rows)
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)]
    assert max(diffs) <= TOLERANCE, diffs
    plain = sr_hidden(load_model(base), rows)
    assert max((g - p).abs().max().item() for g, p in zip(got, plain, strict=True)) > 1e-2
    # Embeddings (mean pooling, no modules.json) of the adapted hidden states.
    vectors = model.embed(rows)
    for vector, hidden in zip(vectors, want, strict=True):
        assert (vector - hidden.mean(0)).abs().max().item() <= TOLERANCE


def test_a_base_found_through_sr_model_dir(bert_base, tmp_path, rows, monkeypatch):
    models = tmp_path / "models"
    shutil.copytree(bert_base, models / "acme" / "tiny-bert")
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    adapter = models / "acme" / "tiny-bert-lora"
    write_adapter(bert_base, adapter, lora, base_name="acme/tiny-bert")
    monkeypatch.setenv("SR_MODEL_DIR", str(models))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    # The adapter itself is a repository ID found there too; its base by its own ID.
    folder = resolve_artifact("acme/tiny-bert-lora")
    assert folder == adapter.resolve()
    check_logits(bert_base, folder, rows)
    assert load_model(folder).adapter.base_dir == (models / "acme" / "tiny-bert").resolve()

    monkeypatch.setenv("SR_MODEL_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(ArtifactNotFound) as missing:
        load_model(folder)
    message = str(missing.value)
    assert message.startswith(f"the base of the adapter {folder}: artifact 'acme/tiny-bert'")
    assert "elsewhere" in message and "\n" not in message


def test_the_card_names_the_adapter_and_its_base(bert_base, tmp_path):
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    model = load_model(adapter)

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    own = digest(adapter / "adapter_model.safetensors")
    # peft's own defaults for a task's saved modules differ between its versions (later ones
    # add "pre_classifier"): the card names what the adapter's config file says.
    saved = json.loads((adapter / "adapter_config.json").read_text())["modules_to_save"]
    assert {"classifier", "score"} <= set(saved)
    # The artifact's weights are the adapter's: no golden reference of the base matches.
    assert model.weights_sha256 == own
    card = model.adapter_card
    assert card == {
        "path": str(adapter),
        "weights_sha256": own,
        "peft_type": "LORA",
        "task_type": "SEQ_CLS",
        "r": 4,
        "lora_alpha": 8,
        "use_rslora": False,
        "target_modules": ["query"],
        "modules_to_save": saved,
        "bias": "none",
        "scale": 2.0,
        "merged_modules": 2,
        "replaced_tensors": 2,
        "base": {
            "artifact": str(bert_base),
            "revision": None,
            "path": str(bert_base.resolve()),
            "weights_sha256": digest(bert_base / "model.safetensors"),
        },
    }
    assert load_model(bert_base).adapter_card is None


def test_bfloat16_serves_the_merged_weights(bert_base, tmp_path, rows):
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    adapter = write_adapter(bert_base, tmp_path / "adapter", lora)
    exact = load_model(adapter).classify_logits(rows)
    reduced = load_model(adapter, dtype="bfloat16").classify_logits(rows)
    assert (reduced - exact).abs().max().item() < 0.05


# ---- what is refused, each with one line ------------------------------------------------


@pytest.fixture
def adapter(bert_base, tmp_path) -> Path:
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    return write_adapter(bert_base, tmp_path / "adapter", lora)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"use_dora": True}, "use_dora (DoRA) is not served"),
        ({"peft_type": "IA3"}, "peft_type 'IA3' is not served (only LORA)"),
        ({"task_type": "CAUSAL_LM"}, "task_type 'CAUSAL_LM' is not served"),
        ({"task_type": "TOKEN_CLS"}, "task_type 'TOKEN_CLS' is not served"),
        ({"bias": "sometimes"}, "bias='sometimes' is not served"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights='pissa' is not served"),
        ({"use_qalora": True}, "use_qalora=True is not served"),
        ({"trainable_token_indices": [5]}, "trainable_token_indices=[5] is not served"),
        ({"target_modules": ["query", "q_proj"]}, "names 'q_proj', which the bert base"),
        ({"target_modules": r".*\.q_proj"}, r"target_modules '.*\\.q_proj' matches none"),
        ({"target_modules": ["word_embeddings"]}, "names 'word_embeddings'"),
        ({"target_modules": ["key"]}, "holds LoRA weights for 'bert.encoder.layer.0.attention"),
        ({"r": 8}, "a rank-8 LoRA of its 32x32 weight"),
        ({"auto_mapping": {"base_model_class": "RobertaForSequenceClassification",
                           "parent_library": "transformers.models.roberta.modeling_roberta"}},
         "trained on a roberta model, but its base"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)  # fmt: skip
def test_what_is_not_served_is_refused_in_one_line(adapter, changes, says):
    edit_config(adapter, **changes)
    with pytest.raises(UnsupportedModel) as refused:
        load_model(adapter)
    message = str(refused.value)
    assert says in message and "\n" not in message, message


def test_an_adapter_trained_on_another_model_type_is_refused(roberta_base, bert_base, tmp_path):
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["query"])
    adapter = write_adapter(roberta_base, tmp_path / "adapter", lora, base_name=str(bert_base))
    with pytest.raises(UnsupportedModel, match=r"trained on a roberta model \(its tensors"):
        load_model(adapter)


def test_a_seq_cls_adapter_without_any_classifier_is_refused(tmp_path):
    base = write_reference(tmp_path / "bert-model", bert_config(), head=False, seed=6)
    lora = peft.LoraConfig(task_type="FEATURE_EXTRACTION", r=4, lora_alpha=8,
                           target_modules=["query"])  # fmt: skip
    adapter = write_adapter(base, tmp_path / "adapter", lora, head=False)
    edit_config(adapter, task_type="SEQ_CLS")
    with pytest.raises(UnsupportedModel, match="neither it nor its base holds the classifier"):
        load_model(adapter)


def test_adapter_folders_resolve_and_name_what_they_lack(adapter, tmp_path):
    assert resolve_artifact(str(adapter)) == adapter.resolve()
    (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")
    with pytest.raises(ArtifactNotFound, match=r"sr loads only adapter_model\.safetensors"):
        resolve_artifact(str(adapter))
    (adapter / "adapter_model.bin").unlink()
    with pytest.raises(ArtifactNotFound, match=r"lacks adapter_model\.safetensors"):
        resolve_artifact(str(adapter))
    # An adapter whose base is an adapter is refused.
    nested = tmp_path / "nested"
    shutil.copytree(adapter, nested)
    edit_config(nested, base_model_name_or_path=str(adapter))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedModel, match="is itself an adapter"):
        load_model(nested)


def test_serving_an_adapter_never_imports_peft_or_transformers(adapter):
    import subprocess
    import sys

    script = (
        "import sys; from sr.models import load_model;"
        f"m = load_model({str(adapter)!r}); m.classify_logits(m.tokenize(['hi']));"
        "bad = [n for n in ('peft', 'transformers') if n in sys.modules];"
        " print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
