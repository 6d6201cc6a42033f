"""sentence-transformers modules around Pooling: `include_prompt: false` without a prompt
(every token pooled; tests/worker/test_prompts.py checks it with one), and
Dense modules (sentence_transformers.models.Dense) between Pooling and Normalize.

A tiny BERT saved by transformers (tests/models/reference.py) gets module files written by
hand. The reference is transformers' hidden states with the pooling, Dense and Normalize
math written out as sentence-transformers documents it; sentence-transformers itself is not
a test dependency. Each row must also be bit-identical alone and inside a batch."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import transformers
from safetensors.torch import save_file

from sr.errors import UnsupportedModel
from sr.models import load_model
from tests.models.reference import VOCAB, random_rows, reference_hidden, write_reference

HIDDEN = 32
LENGTHS = [1, 4, 4, 9, 23, 60, 2]
TOLERANCE = 1e-5
TANH = "torch.nn.modules.activation.Tanh"
IDENTITY = "torch.nn.modules.linear.Identity"
MODE_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
}

# What each torch.nn activation computes, written out (nn.GELU() is the exact erf GELU).
ACTIVATION_MATH = {
    None: torch.tanh,  # no activation_function key: sentence-transformers' default, Tanh
    TANH: torch.tanh,
    IDENTITY: lambda x: x,
    "torch.nn.ReLU": lambda x: x.clamp(min=0),
    "torch.nn.modules.activation.GELU": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "torch.nn.modules.activation.Sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "torch.nn.modules.activation.SiLU": lambda x: x / (1 + torch.exp(-x)),
}


def _bert():
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return write_reference(tmp_path_factory.mktemp("bert"), _bert())


@pytest.fixture(scope="module")
def hidden_states(backbone):
    return reference_hidden(backbone, random_rows(LENGTHS))


def dense_module(in_features, out_features, activation=TANH, *, bias=True, residual=False):
    """A Dense as the test writes it: its config.json fields and its seeded random tensors."""
    config = {"in_features": in_features, "out_features": out_features, "bias": bias}
    if activation is not None:
        config["activation_function"] = activation
    if residual:
        config["use_residual"] = True
    generator = torch.Generator().manual_seed(in_features * 1000 + out_features)
    tensors = {"linear.weight": torch.randn(out_features, in_features, generator=generator) * 0.3}
    if bias:
        tensors["linear.bias"] = torch.randn(out_features, generator=generator) * 0.1
    if residual and in_features != out_features:
        tensors["residual.weight"] = (
            torch.randn(out_features, in_features, generator=generator) * 0.3
        )
    return config, tensors


def write_checkpoint(
    backbone, folder, dense=(), *, modes=("cls", "mean"), normalize=True, include_prompt=False
):
    """A copy of `backbone` with modules.json Transformer -> Pooling -> Dense* ->
    [Normalize] and each module's folder written by hand."""
    shutil.copytree(backbone, folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]
    pooling = {"word_embedding_dimension": HIDDEN, "include_prompt": include_prompt}
    pooling |= {key: name in modes for name, key in MODE_KEYS.items()}
    pooling |= {"pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_lasttoken": False}
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules.append(
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    )
    for config, tensors in dense:
        idx = len(modules)
        path = folder / f"{idx}_Dense"
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(path / "model.safetensors"))
        modules.append(
            {
                "idx": idx,
                "name": str(idx),
                "path": path.name,
                "type": "sentence_transformers.models.Dense",
            }
        )
    if normalize:
        idx = len(modules)
        (folder / f"{idx}_Normalize").mkdir()
        modules.append(
            {
                "idx": idx,
                "name": str(idx),
                "path": f"{idx}_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def reference_embeddings(hidden_states, dense=(), *, modes=("cls", "mean"), normalize=True):
    """Pooling (all tokens: no prompt), then each Dense, then L2 normalisation."""
    out = []
    for h in hidden_states:
        parts = {"cls": h[0], "max": h.max(0).values, "mean": h.sum(0) / h.shape[0]}
        # sentence-transformers concatenates in the order cls, max, mean, ...
        x = torch.cat([parts[m] for m in ("cls", "max", "mean") if m in modes])
        for config, tensors in dense:
            y = x @ tensors["linear.weight"].T
            if config["bias"]:
                y = y + tensors["linear.bias"]
            y = ACTIVATION_MATH[config.get("activation_function")](y)
            if config.get("use_residual"):
                y = y + (x @ tensors["residual.weight"].T if "residual.weight" in tensors else x)
            x = y
        if normalize:
            x = x / torch.sqrt((x * x).sum())
        out.append(x)
    return torch.stack(out)


def assert_rows_alone_equal_batched(model, rows):
    batched = model.embed(rows)
    for i, row in enumerate(rows):
        assert torch.equal(model.embed([row])[0], batched[i]), f"row {i} ({len(row)} tokens)"


def test_include_prompt_false_pools_every_token(backbone, hidden_states, tmp_path):
    folder = write_checkpoint(backbone, tmp_path / "m", include_prompt=False)
    model = load_model(folder)
    rows = random_rows(LENGTHS)
    got = model.embed(rows)
    assert model.embedding_dim == 2 * HIDDEN
    assert (got - reference_embeddings(hidden_states)).abs().max().item() <= TOLERANCE
    # The same answer, to the bit, as the checkpoint that includes the prompt.
    same = load_model(write_checkpoint(backbone, tmp_path / "p", include_prompt=True))
    assert torch.equal(same.embed(rows), got)


DENSE_CHAINS = {
    # LaBSE-like: one Tanh projection, then Normalize.
    "tanh": [dense_module(2 * HIDDEN, 24, TANH)],
    # Two modules, the second without bias and without activation.
    "tanh-identity": [
        dense_module(2 * HIDDEN, 24, TANH),
        dense_module(24, 16, IDENTITY, bias=False),
    ],
    "default-relu-gelu": [
        dense_module(2 * HIDDEN, 40, None),
        dense_module(40, 40, "torch.nn.ReLU"),
        dense_module(40, 20, "torch.nn.modules.activation.GELU"),
    ],
    "sigmoid-silu-residual": [
        dense_module(2 * HIDDEN, 2 * HIDDEN, "torch.nn.modules.activation.Sigmoid", residual=True),
        dense_module(2 * HIDDEN, 12, "torch.nn.modules.activation.SiLU", residual=True),
    ],
}


@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "raw"])
@pytest.mark.parametrize("chain", list(DENSE_CHAINS))
def test_dense_chain_matches_the_reference(backbone, hidden_states, tmp_path, chain, normalize):
    dense = DENSE_CHAINS[chain]
    folder = write_checkpoint(backbone, tmp_path / "m", dense, normalize=normalize)
    model = load_model(folder)
    assert model.embedding_dim == dense[-1][0]["out_features"]
    rows = random_rows(LENGTHS)
    got = model.embed(rows)
    assert got.dtype == torch.float32 and got.shape == (len(rows), model.embedding_dim)
    expected = reference_embeddings(hidden_states, dense, normalize=normalize)
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert_rows_alone_equal_batched(model, rows)


@pytest.mark.parametrize("threads", [1, 2])
def test_dense_rows_are_bit_identical_alone_and_in_batches_of_any_size(backbone, tmp_path, threads):
    dense = DENSE_CHAINS["tanh-identity"]
    model = load_model(write_checkpoint(backbone, tmp_path / "m", dense, modes=("cls", "max")))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        # Fewer rows than the BLAS short-matrix cut-off, and more (up to 70 rows).
        generator = torch.Generator().manual_seed(7)
        lengths = torch.randint(1, 30, (70,), generator=generator).tolist()
        rows = random_rows(lengths, seed=3)
        alone = torch.stack([model.embed([row])[0] for row in rows])
        for size in (2, 5, 13, 70):
            batched = torch.cat([model.embed(rows[i : i + size]) for i in range(0, 70, size)])
            assert torch.equal(batched, alone), f"batches of {size} rows"
    finally:
        torch.set_num_threads(before)


def _refused(backbone, tmp_path, dense, match, *, prepare=None, **kwargs):
    folder = write_checkpoint(backbone, tmp_path / "m", dense, **kwargs)
    if prepare is not None:
        prepare(folder)
    with pytest.raises(UnsupportedModel, match=match):
        load_model(folder)


def test_unknown_activation_is_refused_by_name(backbone, tmp_path):
    dense = [dense_module(2 * HIDDEN, 8, "torch.nn.modules.activation.Softmax")]
    _refused(
        backbone,
        tmp_path,
        dense,
        r"2_Dense/config\.json: activation_function "
        r"'torch\.nn\.modules\.activation\.Softmax' is not supported",
    )


def test_custom_activation_module_is_refused(backbone, tmp_path):
    dense = [dense_module(2 * HIDDEN, 8, "my_package.activations.Swish")]
    _refused(backbone, tmp_path, dense, r"activation_function 'my_package\.activations\.Swish'")


def test_pytorch_bin_dense_weights_are_refused(backbone, tmp_path):
    def to_bin(folder):
        weights = folder / "2_Dense" / "model.safetensors"
        weights.rename(folder / "2_Dense" / "pytorch_model.bin")

    _refused(
        backbone,
        tmp_path,
        [dense_module(2 * HIDDEN, 8)],
        r"2_Dense/pytorch_model\.bin: sr loads only safetensors",
        prepare=to_bin,
    )


def test_dense_in_features_must_match_the_pooled_size(backbone, tmp_path):
    # One pooling mode: the pooled size is 32, the Dense expects 64.
    _refused(
        backbone,
        tmp_path,
        [dense_module(2 * HIDDEN, 8)],
        r"2_Dense/config\.json: in_features 64 does not match the pooled size 32",
        modes=("mean",),
    )


def test_dense_chain_sizes_must_agree(backbone, tmp_path):
    dense = [dense_module(2 * HIDDEN, 24), dense_module(20, 8)]
    _refused(
        backbone,
        tmp_path,
        dense,
        r"3_Dense/config\.json: in_features 20 does not match the previous Dense's "
        r"out_features 24",
    )


def test_dense_weights_must_match_the_config(backbone, tmp_path):
    config, tensors = dense_module(2 * HIDDEN, 8)
    wrong = {**tensors, "linear.weight": torch.zeros(9, 2 * HIDDEN)}
    _refused(
        backbone,
        tmp_path,
        [(config, wrong)],
        r"2_Dense/model\.safetensors: linear\.weight has shape \(9, 64\)",
    )
    config, tensors = dense_module(2 * HIDDEN, 8, bias=False)
    _refused(
        backbone,
        tmp_path / "b",
        [({**config, "bias": True}, tensors)],
        r"2_Dense/model\.safetensors: lacks the tensor 'linear\.bias'",
    )


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("in_features", "64", r"2_Dense/config\.json: in_features must be a positive integer"),
        ("bias", "yes", r"2_Dense/config\.json: bias must be true or false"),
        (
            "module_input_name",
            "token_embeddings",
            r"2_Dense/config\.json: module_input_name='token_embeddings' is not supported",
        ),
    ],
)
def test_bad_dense_config_fields_are_refused(backbone, tmp_path, field, value, match):
    config, tensors = dense_module(2 * HIDDEN, 8)
    _refused(backbone, tmp_path, [({**config, field: value}, tensors)], match)


def test_dense_after_normalize_is_refused(backbone, tmp_path):
    def swap(folder):
        modules = json.loads((folder / "modules.json").read_text())
        modules[2]["idx"], modules[3]["idx"] = 3, 2  # Normalize before Dense
        (folder / "modules.json").write_text(json.dumps(modules))

    _refused(
        backbone,
        tmp_path,
        [dense_module(2 * HIDDEN, 8)],
        r"module 'sentence_transformers\.models\.Dense' at position 3 is not supported",
        prepare=swap,
    )
