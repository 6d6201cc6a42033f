"""Tiny random token-classification checkpoints written by transformers, and transformers'
own token-classification pipeline on them: the independent reference for sr's token heads
and their entities (transformers is a test dependency only).

The entity rules differ by tokenizer kind, so the families cover each: BERT, MPNet and
ModernBERT get the embedded MiniLM's WordPiece (word-aware: `##` marks a subword), RoBERTa a
byte-level BPE and XLM-R a Metaspace Unigram with an unknown token (no subword prefix: the
pipeline's space heuristic), both trained here on a fixed corpus, offline.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from sr.models.artifacts import embedded_default_dir
from tests.models.reference import TOKENIZER_FILES

# B-/I- tags, and one label without a prefix (a tag of its own).
LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "PHONE")
FAMILIES = ("bert", "roberta", "xlm-roberta", "mpnet", "modernbert")
_CORPUS = (
    "My name is Wolfgang and I live in Berlin.",
    "Sarah Jessica Parker lives in New York City with her family.",
    "Call me at 555 010 9999 or write to the office in Paris.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Zoe visited Zurich and Istanbul in the summer of 2023.",
    "Microsoft and Google opened offices in London and Madrid.",
)
# The special tokens of RoBERTa and XLM-R, at their ids there.
_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(_SPECIALS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(list(_CORPUS) * 3, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False
    )
    return tokenizer


def _metaspace_unigram():
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.Unigram())
    # As XLM-R's: runs of spaces folded into one, so offsets skip characters.
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=200, special_tokens=list(_SPECIALS), unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 3, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )  # fmt: skip
    return tokenizer


def _config(family: str, vocab: int):
    import transformers

    labels = {
        "id2label": dict(enumerate(LABELS)),
        "label2id": {label: i for i, label in enumerate(LABELS)},
    }
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    if family == "bert":
        return transformers.BertConfig(
            vocab_size=vocab, max_position_embeddings=128, **small, **labels
        )
    if family == "mpnet":  # positions from pad_token_id + 1, as all-mpnet-base-v2's
        return transformers.MPNetConfig(
            vocab_size=vocab, max_position_embeddings=130, pad_token_id=0, **small, **labels
        )
    if family in ("roberta", "xlm-roberta"):
        kind = transformers.RobertaConfig if family == "roberta" else transformers.XLMRobertaConfig
        return kind(
            vocab_size=vocab, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
            bos_token_id=0, eos_token_id=2, **small, **labels,
        )  # fmt: skip
    if family == "modernbert":
        # The hidden width is a multiple of 64: torch's vectorised SiLU (the head's activation)
        # computes the last elements of a tensor whose size is not a multiple of its
        # vector step on another path, so at a width of 48 a 3-token text alone got other
        # bits than packed with other texts (measured with seed 3). Real checkpoints' widths
        # (768, 1152, 3072, ...) are multiples of 64, and the worker's load-time probe turns
        # batching off for any whose rows are not the same alone and packed.
        return transformers.ModernBertConfig(
            vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=40, max_position_embeddings=128, global_attn_every_n_layers=2,
            local_attention=8, pad_token_id=0, bos_token_id=101, eos_token_id=102,
            cls_token_id=101, sep_token_id=102, classifier_activation="silu", **labels,
        )  # fmt: skip
    raise ValueError(family)


def write_token_model(folder: Path, family: str, *, seed: int = 0) -> Path:
    """A seeded random `*ForTokenClassification` of `family` saved by transformers in
    `folder` with its tokenizer.json. Its classifier is scaled up so that several labels
    win, token by token."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family in ("bert", "mpnet", "modernbert"):
        source = embedded_default_dir()
        for name in TOKENIZER_FILES:
            shutil.copyfile(source / name, folder / name)
        vocab = 30522
    else:
        tokenizer = _byte_level_bpe() if family == "roberta" else _metaspace_unigram()
        tokenizer.save(str(folder / "tokenizer.json"))
        vocab = tokenizer.get_vocab_size()
    torch.manual_seed(seed)
    model = transformers.AutoModelForTokenClassification.from_config(
        _config(family, vocab), attn_implementation="eager"
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
        for module in model.modules():  # LayerNorms near 1, so that tokens differ
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1.0 + torch.randn_like(module.weight) * 0.1)
                if module.bias is not None:
                    module.bias.copy_(torch.randn_like(module.bias) * 0.1)
    _spread_labels(model.eval(), folder)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _spread_labels(model, folder: Path) -> None:
    """A random classifier on a random encoder gives every token the same label: the tokens'
    states share most of their value. Centre the classifier on the corpus' states and scale
    each label's logit to a spread of 2, so that labels change from token to token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    states: list[torch.Tensor] = []
    hook = model.classifier.register_forward_hook(lambda _m, args, _out: states.append(args[0][0]))
    with torch.no_grad():
        for text in _CORPUS:
            model(input_ids=torch.tensor([tokenizer.encode(text).ids]))
    hook.remove()
    x = torch.cat(states)
    mean = x.mean(0)
    with torch.no_grad():
        weight = torch.randn_like(model.classifier.weight)
        spread = ((x - mean) @ weight.T).std(0)
        weight /= spread[:, None] / 2.0
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(-(weight @ mean) + torch.randn(len(LABELS)) * 0.3)


def reference_model(folder: Path):
    import transformers

    model = transformers.AutoModelForTokenClassification.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, local_files_only=True
    )
    return model.eval()


def reference_tokenizer(folder: Path):
    """The folder's tokenizer.json as transformers' fast tokenizer, its special tokens named
    (the pipeline needs the unknown token's id)."""
    import transformers

    if (Path(folder) / "vocab.txt").exists():  # WordPiece
        names = dict(
            unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
            mask_token="[MASK]",
        )  # fmt: skip
    else:
        names = dict(
            bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
            mask_token="<mask>", cls_token="<s>", sep_token="</s>",
        )  # fmt: skip
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(Path(folder) / "tokenizer.json"),
        model_input_names=["input_ids", "attention_mask"],
        **names,
    )


def reference_pipeline(folder: Path):
    import transformers

    return transformers.pipeline(
        "token-classification", model=reference_model(folder),
        tokenizer=reference_tokenizer(folder), device="cpu",
    )  # fmt: skip
