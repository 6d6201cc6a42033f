"""Tiny random checkpoints written by transformers, and transformers' own answers for them:
the independent reference every family is checked against (transformers is a test
dependency only; sr never imports it).

`write_reference(folder, config)` saves a seeded random model with `save_pretrained` and a
tokenizer.json (the embedded MiniLM's; the comparisons feed token ids, so the vocabulary
only has to be large enough). `reference_hidden(folder, rows)` runs each row alone through
transformers, without padding, so no mask convention enters the comparison.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import torch

from sr.models.artifacts import embedded_default_dir

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
VOCAB = 30522  # the MiniLM tokenizer's


def write_reference(folder: Path, config, *, head: bool = False, seed: int = 0) -> Path:
    """Save a seeded random `AutoModel` (or `AutoModelForSequenceClassification` with
    `head`) for `config` in `folder`, with a tokenizer."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    kind = transformers.AutoModelForSequenceClassification if head else transformers.AutoModel
    model = kind.from_config(config, attn_implementation="eager")
    # Random, not the init's near-zero values: every weight must matter to the comparison.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    source = embedded_default_dir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, folder / name)
    return folder


def reference_model(folder: Path, *, head: bool = False):
    import transformers

    kind = transformers.AutoModelForSequenceClassification if head else transformers.AutoModel
    model = kind.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def reference_hidden(folder: Path, rows: list[list[int]]) -> list[torch.Tensor]:
    """transformers' last hidden states [L, H] of each row, run alone."""
    model = reference_model(folder)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([row])).last_hidden_state[0] for row in rows]


def reference_logits(folder: Path, rows: list[list[int]]) -> torch.Tensor:
    """transformers' sequence-classification logits [n, labels], each row run alone."""
    model = reference_model(folder, head=True)
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([row])).logits for row in rows])


def random_rows(lengths: list[int], *, low: int = 1000, high: int = 20000, seed: int = 0):
    """Token ids for rows of the given lengths (ids away from the special tokens)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(low, high, (n,), generator=generator).tolist() for n in lengths]


def sr_hidden(model, rows: list[list[int]]) -> list[torch.Tensor]:
    """sr's last hidden states of `rows`, packed into one forward, split back per row."""
    from sr.models.blocks import Packed

    ids = torch.tensor([t for row in rows for t in row])
    packed = Packed([len(row) for row in rows])
    with torch.inference_mode():
        hidden = model.backbone.hidden_states(ids, packed)
    return [hidden[a:b] for a, b in itertools.pairwise(packed.starts)]


def assert_close_and_packing_invariant(model, rows, expected, tolerance: float = 1e-5) -> None:
    """Each row within `tolerance` of transformers' `expected`, and bit-identical alone and
    packed with the other rows."""
    for row, want, got in zip(rows, expected, sr_hidden(model, rows), strict=True):
        assert (got - want).abs().max().item() <= tolerance, f"row of {len(row)} tokens"
        (alone,) = sr_hidden(model, [row])
        assert torch.equal(alone, got), f"row of {len(row)} tokens differs alone and packed"
