"""Random-weight checkpoints of realistic size, one per model family sr serves.

    from bench.family_models import FAMILIES, build_family
    folder = build_family("modernbert", Path("/tmp/mb"))          # save_pretrained + tokenizer
    folder = build_family("qwen3", Path("/tmp/q3"), layers=1)     # fewer layers
    folder = build_family("bert", Path("/tmp/ner"), head="token")  # a token-classification head

Each family copies the widths, head counts and options of a well-known checkpoint (named in
`FamilySpec.like`) with fewer layers, so a CPU benchmark of all of them stays short. The
model is built by transformers itself (`AutoConfig.for_model` + `AutoModel.from_config`,
its own weight init) and written with `save_pretrained` (safetensors), together with the
embedded MiniLM's tokenizer files (every family reads token ids below 30522, so the
vocabulary only has to be that large) and the sentence-transformers module files of the
original (Transformer -> Pooling -> [Dense ...] -> Normalize, with its pooling mode; the
Dense modules, EmbeddingGemma's, get seeded random weights), so sr, transformers and
sentence-transformers all load the same folder.

`head="token"` writes the family's token-classification model instead
(`AutoModelForTokenClassification.from_config`: the backbone plus its `*ForTokenClassification`
head, 9 labels, CoNLL-2003's B-/I- tags and O, in config.json's id2label), with the tokenizer
but no sentence-transformers module files, as a published NER checkpoint is; only for the
families whose sr model serves a token head (`token_head_families()`, read from sr's
`architectures`).

Used by bench/bench_families.py and bench/gpu_check.sh (`python -m bench.family_models
NAME ROOT [--head token]` writes ROOT/<name>-L<layers>-s<seed> (ROOT/<name>-token-L<layers>-s<seed>
for a token head), or reuses it, and prints its path).
transformers is a test/bench dependency only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

# The embedded MiniLM's tokenizer files (WordPiece, 30522 ids).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
TOKENIZER_VOCAB = 30522
MAX_SEQ_LENGTH = 512  # sentence_bert_config.json; the benchmark's texts stay far below

EMBED, TOKEN = "embed", "token"
HEADS = (EMBED, TOKEN)
# The token head's labels, in output order (CoNLL-2003's tag set).
TOKEN_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
# transformers' own names for the geometry in configs that do not say hidden_size etc.
# (DistilBERT: `dim`, `n_heads`, `hidden_dim`).
_CONFIG_ALIASES = {
    "hidden_size": ("dim",),
    "num_attention_heads": ("n_heads",),
    "intermediate_size": ("hidden_dim",),
}


def config_value(config: dict, key: str):
    """config[key], or its value under the family's own name for it (`_CONFIG_ALIASES`)."""
    for name in (key, *_CONFIG_ALIASES.get(key, ())):
        if name in config:
            return config[name]
    raise KeyError(key)


@dataclass(frozen=True)
class FamilySpec:
    name: str  # the benchmark's name for it (the model_type)
    like: str  # the checkpoint whose widths and options it copies
    real_layers: int  # the original's depth
    layers: int  # the depth built by default (fewer, to keep a CPU run short)
    config: dict = field(default_factory=dict)  # AutoConfig.for_model(model_type, **config)
    pooling: str = "mean"  # sentence-transformers pooling mode of the original
    normalize: bool = True
    padding_side: str = "right"  # how sentence-transformers pads a batch of it
    # sentence-transformers Dense modules after pooling, (in, out) each: no bias, Identity
    # activation, as EmbeddingGemma's two.
    dense: tuple[tuple[int, int], ...] = ()

    @property
    def model_type(self) -> str:
        return self.name

    def describe(self, layers: int | None = None, head: str = EMBED) -> str:
        c = self.config
        kv = f", {c['num_key_value_heads']} kv heads" if "num_key_value_heads" in c else ""
        dim = f", head_dim {c['head_dim']}" if "head_dim" in c else ""
        if head == TOKEN:
            output = f"token-classification head ({len(TOKEN_LABELS)} labels)"
        else:
            dense = "".join(f" + dense {n_in}->{n_out}" for n_in, n_out in self.dense)
            output = f"{self.pooling} pooling{dense}{' + normalize' if self.normalize else ''}"
        return (
            f"{self.like}-like: hidden {config_value(c, 'hidden_size')}, "
            f"{config_value(c, 'num_attention_heads')} heads{kv}{dim}, "
            f"intermediate {config_value(c, 'intermediate_size')}, "
            f"{layers or self.layers} of {self.real_layers} layers, vocab {c['vocab_size']}, "
            f"{output}"
        )


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        FamilySpec(
            "bert",
            like="sentence-transformers/all-MiniLM-L6-v2",
            real_layers=6,
            layers=6,
            config=dict(
                vocab_size=30522,
                hidden_size=384,
                num_attention_heads=12,
                intermediate_size=1536,
                max_position_embeddings=512,
                type_vocab_size=2,
                hidden_act="gelu",
                layer_norm_eps=1e-12,
                pad_token_id=0,
            ),
        ),
        FamilySpec(
            "xlm-roberta",
            like="intfloat/multilingual-e5-base",
            real_layers=12,
            layers=4,
            # The real vocabulary is 250002 ids (768 MB of float32 embeddings): a small
            # one keeps memory and load time low and changes nothing in the forward.
            config=dict(
                vocab_size=30522,
                hidden_size=768,
                num_attention_heads=12,
                intermediate_size=3072,
                max_position_embeddings=514,
                type_vocab_size=1,
                hidden_act="gelu",
                layer_norm_eps=1e-5,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
            ),
        ),
        FamilySpec(
            "mpnet",
            like="sentence-transformers/all-mpnet-base-v2",
            real_layers=12,
            layers=4,
            config=dict(
                vocab_size=30527,
                hidden_size=768,
                num_attention_heads=12,
                intermediate_size=3072,
                max_position_embeddings=514,
                hidden_act="gelu",
                layer_norm_eps=1e-5,
                relative_attention_num_buckets=32,
                pad_token_id=1,
                bos_token_id=0,
                eos_token_id=2,
            ),
        ),
        FamilySpec(
            "distilbert",
            like="distilbert-base-uncased",
            real_layers=6,
            layers=6,
            # DistilBertConfig's own names (`dim`, `n_heads`, `hidden_dim`; `n_layers` comes
            # from build_config's num_hidden_layers through its attribute_map). Its LayerNorm
            # eps is fixed at 1e-12 in transformers' modeling file, not a config key.
            config=dict(
                vocab_size=30522,
                dim=768,
                n_heads=12,
                hidden_dim=3072,
                max_position_embeddings=512,
                sinusoidal_pos_embds=False,
                activation="gelu",
                pad_token_id=0,
            ),
        ),
        FamilySpec(
            "deberta-v2",
            like="microsoft/deberta-v3-base",
            real_layers=12,
            layers=4,
            # The real vocabulary is 128100 ids (394 MB of float32 embeddings).
            config=dict(
                vocab_size=30522,
                hidden_size=768,
                num_attention_heads=12,
                intermediate_size=3072,
                max_position_embeddings=512,
                relative_attention=True,
                position_buckets=256,
                max_relative_positions=-1,
                pos_att_type=["p2c", "c2p"],
                share_att_key=True,
                norm_rel_ebd="layer_norm",
                position_biased_input=False,
                type_vocab_size=0,
                hidden_act="gelu",
                layer_norm_eps=1e-7,
                pad_token_id=0,
            ),
        ),
        FamilySpec(
            "modernbert",
            like="answerdotai/ModernBERT-base",
            real_layers=22,
            layers=3,  # layer 0 global, layers 1 and 2 local (global every 3)
            config=dict(
                vocab_size=50368,
                hidden_size=768,
                num_attention_heads=12,
                intermediate_size=1152,
                max_position_embeddings=8192,
                global_attn_every_n_layers=3,
                local_attention=128,
                global_rope_theta=160000.0,
                local_rope_theta=10000.0,
                hidden_activation="gelu",
                norm_eps=1e-5,
                norm_bias=False,
                attention_bias=False,
                mlp_bias=False,
                pad_token_id=50283,
                bos_token_id=50281,
                eos_token_id=50282,
                cls_token_id=50281,
                sep_token_id=50282,
            ),
        ),
        FamilySpec(
            "qwen3",
            like="Qwen/Qwen3-Embedding-0.6B",
            real_layers=28,
            layers=2,
            # The real vocabulary is 151669 ids (620 MB of float32 embeddings).
            config=dict(
                vocab_size=30522,
                hidden_size=1024,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
                intermediate_size=3072,
                max_position_embeddings=32768,
                hidden_act="silu",
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                attention_bias=False,
                tie_word_embeddings=True,
            ),
            pooling="lasttoken",
            padding_side="left",  # Qwen3-Embedding's tokenizer pads on the left
        ),
        FamilySpec(
            "gemma3_text",
            like="google/embeddinggemma-300m",
            real_layers=24,
            layers=6,  # layers 0-4 sliding, layer 5 full (every sixth, as the original)
            # The real vocabulary is 262144 ids (805 MB of float32 embeddings).
            config=dict(
                vocab_size=30522,
                hidden_size=768,
                num_attention_heads=3,
                num_key_value_heads=1,
                head_dim=256,
                intermediate_size=1152,
                max_position_embeddings=2048,
                hidden_activation="gelu_pytorch_tanh",
                rms_norm_eps=1e-6,
                query_pre_attn_scalar=256,
                sliding_window=512,
                sliding_window_pattern=6,
                use_bidirectional_attention=True,
                rope_parameters={
                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
                attention_bias=False,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=1,
            ),
            pooling="mean",
            dense=((768, 3072), (3072, 768)),
        ),
    )
}


def _embedded_tokenizer_dir() -> Path:
    from sr.models.artifacts import embedded_default_dir

    return embedded_default_dir()


def _module_files(folder: Path, spec: FamilySpec, hidden: int, seed: int) -> None:
    from sr.models.testing import write_sentence_transformers_modules

    write_sentence_transformers_modules(
        folder, hidden, MAX_SEQ_LENGTH, pooling=spec.pooling, normalize=spec.normalize
    )
    if spec.dense:
        _dense_files(folder, spec, seed)


DENSE_IDENTITY = "torch.nn.modules.linear.Identity"


def _dense_files(folder: Path, spec: FamilySpec, seed: int) -> None:
    """The Dense modules between Pooling and Normalize: config.json and seeded random
    `linear.weight` (nn.Linear's init scale) in model.safetensors, as sentence-transformers
    saves them; modules.json renumbered around them."""
    from safetensors.torch import save_file

    modules = json.loads((folder / "modules.json").read_text())
    head, tail = modules[:2], modules[2:]  # Transformer, Pooling | [Normalize]
    generator = torch.Generator().manual_seed(seed)
    for n_in, n_out in spec.dense:
        idx = len(head)
        path = folder / f"{idx}_Dense"
        path.mkdir(exist_ok=True)
        config = {"in_features": n_in, "out_features": n_out, "bias": False,
                  "activation_function": DENSE_IDENTITY}  # fmt: skip
        (path / "config.json").write_text(json.dumps(config, indent=2))
        bound = n_in**-0.5
        weight = (torch.rand(n_out, n_in, generator=generator) * 2 - 1) * bound
        save_file({"linear.weight": weight.contiguous()}, str(path / "model.safetensors"))
        head.append({"idx": idx, "name": str(idx), "path": path.name,
                     "type": "sentence_transformers.models.Dense"})  # fmt: skip
    for module in tail:
        idx = len(head)
        old, new = folder / module["path"], folder / f"{idx}_{module['type'].rsplit('.', 1)[1]}"
        if old != new:
            old.rename(new)
        head.append({**module, "idx": idx, "name": str(idx), "path": new.name})
    (folder / "modules.json").write_text(json.dumps(head, indent=2))


def dense_weights(folder: Path, spec: FamilySpec) -> list[torch.Tensor]:
    """The Dense modules' weights of a folder written here, in order (the reference
    applies them after pooling)."""
    from safetensors.torch import load_file

    return [
        load_file(str(folder / f"{idx}_Dense" / "model.safetensors"))["linear.weight"]
        for idx in range(2, 2 + len(spec.dense))
    ]


def _tokenizer_files(folder: Path, spec: FamilySpec) -> None:
    source = _embedded_tokenizer_dir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, folder / name)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    config["padding_side"] = spec.padding_side
    config["model_max_length"] = MAX_SEQ_LENGTH
    config_file.write_text(json.dumps(config, indent=2))


def build_config(name: str, *, layers: int | None = None, head: str = EMBED):
    """The transformers config of family `name` (`layers` overrides the default depth; a
    token head adds its labels)."""
    import transformers

    spec = FAMILIES[name]
    labels = {}
    if head == TOKEN:
        labels = dict(
            id2label=dict(enumerate(TOKEN_LABELS)),
            label2id={label: i for i, label in enumerate(TOKEN_LABELS)},
        )
    return transformers.AutoConfig.for_model(
        spec.model_type, num_hidden_layers=layers or spec.layers, **spec.config, **labels
    )


def token_head_families() -> list[str]:
    """The families whose sr model serves a `*ForTokenClassification` head (the classes
    each lists in its `architectures`), in FAMILIES' order."""
    from sr.models.families import family_for
    from sr.models.heads import TOKEN as SR_TOKEN

    return [
        name
        for name, spec in FAMILIES.items()
        if SR_TOKEN in (getattr(family_for(spec.model_type), "architectures", None) or {}).values()
    ]


def _check_head(name: str, head: str) -> None:
    if head not in HEADS:
        raise ValueError(f"head {head!r}: one of {', '.join(HEADS)}")
    if head == TOKEN and name not in token_head_families():
        raise ValueError(
            f"{name}: sr serves no token-classification head for it "
            f"(families with one: {', '.join(token_head_families())})"
        )


def quiet_transformers() -> None:
    """No progress bars or load reports from transformers between a benchmark's lines."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def build_family(
    name: str, folder: Path, *, layers: int | None = None, seed: int = 0, head: str = EMBED
) -> Path:
    """Write family `name`'s random model (transformers' own init, seeded) into `folder`
    with `save_pretrained` and a tokenizer: the bare model and the sentence-transformers
    module files (head "embed"), or the model with its token-classification head (head
    "token")."""
    import transformers

    _check_head(name, head)
    spec = FAMILIES[name]
    config = build_config(name, layers=layers, head=head)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    auto = transformers.AutoModelForTokenClassification if head == TOKEN else transformers.AutoModel
    model = auto.from_config(config)
    model.save_pretrained(folder, safe_serialization=True)
    _tokenizer_files(folder, spec)
    if head == EMBED:
        _module_files(folder, spec, int(config.hidden_size), seed)
    return folder


def family_folder_name(name: str, depth: int, seed: int, head: str = EMBED) -> str:
    """`<name>-L<depth>-s<seed>`; `<name>-token-L<depth>-s<seed>` for a token head."""
    kind = "" if head == EMBED else f"-{head}"
    return f"{name}{kind}-L{depth}-s{seed}"


def _complete(folder: Path, head: str) -> bool:
    """A finished build of `head`: its files there, and config.json naming a token
    classifier exactly when the head is "token" (never one head's folder for the other)."""
    files = ("config.json", "model.safetensors") + (("modules.json",) if head == EMBED else ())
    if not all((folder / f).is_file() for f in files):
        return False
    try:
        names = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    token = any(str(n).endswith("ForTokenClassification") for n in names)
    return token == (head == TOKEN)


def cached_family(
    name: str, root: Path, *, layers: int | None = None, seed: int = 0, head: str = EMBED
) -> Path:
    """`root/<name>-L<layers>-s<seed>` (`<name>-token-L...` for a token head), built by
    `build_family` unless a previous run left a complete one of that head there (reruns,
    and sr serve and the benchmark, share one folder)."""
    _check_head(name, head)
    depth = layers or FAMILIES[name].layers
    folder = Path(root) / family_folder_name(name, depth, seed, head)
    if _complete(folder, head):
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    build_family(name, partial, layers=depth, seed=seed, head=head)
    partial.rename(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write one family's random checkpoint under ROOT (reused if there) and "
        "print its folder."
    )
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument(
        "root",
        type=Path,
        help="the folder is ROOT/<family>-L<layers>-s<seed> (<family>-token-L... for --head token)",
    )
    parser.add_argument("--layers", type=int, default=None, help="default: the family's own")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--head", choices=HEADS, default=EMBED, help="embed (bare model, default) or token"
    )
    args = parser.parse_args(argv)
    quiet_transformers()
    try:
        folder = cached_family(
            args.family, args.root, layers=args.layers, seed=args.seed, head=args.head
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{FAMILIES[args.family].describe(args.layers, args.head)}", file=sys.stderr)
    print(folder.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
