"""The startup golden check: fixed inputs, run twice, compared with recorded references.

A worker reports ready only after `golden_check(model)` passes: the golden inputs must give
bit-identical answers on a rerun, and when the weights are ones with a recorded reference
(matched by the sha256 of model.safetensors) the embeddings must match it within 1e-5 on
CPU. References are recorded with sentence-transformers by tests/models/record_golden.py;
sr itself never imports sentence-transformers.

The references are float32 answers. A model served in a reduced precision (`model.dtype`
bfloat16 or float16) is held to a bound of its dtype instead (`REDUCED_PRECISION`): a max
abs diff per component and a least cosine similarity per row, each several times what the
embedded MiniLM measures (bfloat16: 2.0e-3 and 0.99993; float16: 3.1e-4 and 0.999998).
Weights without a recorded reference are measured, at a reduced precision, against a
float32 forward of the same weights (loaded for the check, then dropped), so every model
served in bfloat16/float16 reports its deviation from float32 and is held to the bound.
Every result carries the deviation measured: max abs diff and least row cosine, and what
it was measured against (`against`: the reference file, `float32 forward`, or None).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Literal

import attrs
import torch

from sr.devices import cpu_budget

GOLDEN_INPUTS: tuple[str, ...] = (
    "hello",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
    "Refunds: 30 days!!! (see §4.2) -- no questions asked... really?",
    "Crème brûlée, naïve café, Straße, Ångström, déjà vu.",
    "東京は日本の首都です。 Москва — столица России. 🙂🚀",
    "def route(x): return x['model'] if x else None  # 404 <b>not</b> found",
    "A router serves small encoder models as pools of worker processes; each replica loads "
    "its own copy of the weights, answers health probes, and batches the rows of concurrent "
    "requests into shared forward passes when that leaves every answer bit-identical.",
)

REFERENCE_FILES = (Path(__file__).with_name("golden_minilm.json"),)
CPU_TOLERANCE = 1e-5
# Accelerators may use other kernels (and TF32); the spec bounds the CPU only.
ACCELERATOR_TOLERANCE = 1e-3
# dtype -> (max abs diff, least row cosine) against the float32 references, on any device.
# bfloat16 keeps 8 mantissa bits (relative step 2**-8 = 3.9e-3), float16 11 (4.9e-4): the
# bounds are ~5x the MiniLM's measured max abs diff and >10x its measured 1 - cosine.
REDUCED_PRECISION: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (1e-2, 0.999),
    torch.float16: (2e-3, 0.9999),
}


FLOAT32_FORWARD = "float32 forward"  # `against` when no reference file exists


@attrs.frozen
class GoldenOutputs:
    """One run of the golden inputs: the embeddings and the head's logits (None: no head)."""

    embeddings: torch.Tensor
    logits: torch.Tensor | None = None


@attrs.frozen
class GoldenResult:
    status: Literal["passed", "failed"]
    reason: str
    max_abs_diff: float | None = None
    reference: str | None = None  # the reference file compared with, if any
    min_cosine: float | None = None  # least row cosine to the float32 answers
    against: str | None = None  # the reference file name, FLOAT32_FORWARD, or None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def golden_token_ids(model) -> list[list[int]]:
    limit = model.max_position_embeddings
    if model.max_seq_length is not None:
        limit = min(limit, model.max_seq_length)
    return [model.truncate(ids, limit) for ids in model.tokenize(list(GOLDEN_INPUTS))]


def load_reference(weights_sha256: str, files=REFERENCE_FILES) -> tuple[Path, dict] | None:
    for path in files:
        reference = json.loads(Path(path).read_text())
        if reference.get("weights_sha256") == weights_sha256:
            return Path(path), reference
    return None


def float32_twin_embeddings(model, ids: list[list[int]]) -> torch.Tensor:
    """The golden embeddings of `model`'s weights computed in float32 on its device (a
    second copy of the weights, loaded for this and dropped)."""
    from sr.models.encoder import load_model

    return load_model(model.artifact_dir, device=str(model.device), dtype="float32").embed(ids)


def golden_outputs(model, ids: list[list[int]]) -> GoldenOutputs:
    """The golden inputs' answers as served: embeddings, and the head's logits (per text,
    or per token for a token-classification head) when the model has a head."""
    embeddings = model.embed(ids)
    if model.head_labels is None:
        return GoldenOutputs(embeddings)
    head = model.token_logits if getattr(model, "head_task", None) == "token" else None
    return GoldenOutputs(embeddings, (head or model.classify_logits)(ids))


def outputs_digest(ids: list[list[int]], outputs: GoldenOutputs) -> str:
    """sha256 over the token ids and every answer's shape, dtype and bytes: two equal
    digests are the same inputs answered with the same bits."""
    digest = hashlib.sha256(json.dumps(ids).encode())
    for tensor in (outputs.embeddings, outputs.logits):
        if tensor is None:
            digest.update(b"none")
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def golden_check(
    model, *, references=REFERENCE_FILES, float32_embed=None, first: GoldenOutputs | None = None
) -> GoldenResult:
    """Run the golden inputs twice; compare with a recorded reference when one exists, or,
    at a reduced precision, with a float32 forward of the same weights (`float32_embed`,
    ids -> embeddings; default `float32_twin_embeddings`). `first`: the first run's
    answers where the caller has them already (`golden_outputs`)."""
    with weights_digest_beside(model) as digest:
        return _check(model, digest, references, float32_embed, first)


@contextlib.contextmanager
def weights_digest_beside(model) -> Iterator[Callable[[], str]]:
    """A callable giving `model.weights_sha256`, hashed meanwhile beside the caller's forwards.

    Where the forwards leave a core free, hashing the file runs on a helper thread, as
    hashlib lets go of the GIL (MiniLM's 90 MB on a 2-core host, 1 thread: the check 0.18 s
    against 0.26 s one after the other); on every core, the helper would only slow the
    forwards' team, so the digest is then hashed when asked for."""
    if torch.get_num_threads() >= cpu_budget():
        yield lambda: model.weights_sha256
        return
    with ThreadPoolExecutor(1, thread_name_prefix="sr-golden-digest") as hashing:
        yield hashing.submit(lambda: model.weights_sha256).result


def _check(
    model, digest: Callable[[], str], references, float32_embed, first_run: GoldenOutputs | None
) -> GoldenResult:
    try:
        ids = golden_token_ids(model)
        first_run = first_run or golden_outputs(model, ids)
        second_run = golden_outputs(model, ids)
    except Exception as exc:  # a model that cannot run its golden inputs is failed, not crashed
        return GoldenResult("failed", f"golden inputs raised {type(exc).__name__}: {exc}")
    first, second = first_run.embeddings, second_run.embeddings
    if not torch.isfinite(first).all():
        return GoldenResult("failed", "golden embeddings contain NaN or infinity")
    if not torch.equal(first, second):
        diff = float((first - second).abs().max())
        return GoldenResult("failed", f"reruns differ (max abs diff {diff:.3g})", diff)
    if first_run.logits is not None and not torch.equal(first_run.logits, second_run.logits):
        return GoldenResult("failed", "classification head reruns differ")

    dtype = getattr(model, "dtype", torch.float32)
    found = load_reference(digest(), references)
    if found is None:
        if dtype not in REDUCED_PRECISION:
            return GoldenResult(
                "passed", "reruns bit-identical; no recorded reference for these weights"
            )
        try:
            expected = (float32_embed or partial(float32_twin_embeddings, model))(ids)
        except Exception as exc:
            return GoldenResult(
                "failed", f"float32 forward for comparison raised {type(exc).__name__}: {exc}"
            )
        diff = float((first - expected.float()).abs().max())
        return _reduced_precision(first, expected.float(), diff, dtype, FLOAT32_FORWARD, None)
    path, reference = found
    if list(reference["inputs"]) != list(GOLDEN_INPUTS):
        return GoldenResult("failed", f"{path.name} was recorded for other inputs", None, path.name)
    expected = torch.tensor(reference["embeddings"], dtype=torch.float32)
    if expected.shape != first.shape:
        return GoldenResult(
            "failed",
            f"shape {tuple(first.shape)} != reference {tuple(expected.shape)}",
            None,
            path.name,
        )
    diff = float((first - expected).abs().max())
    if dtype in REDUCED_PRECISION:
        return _reduced_precision(first, expected, diff, dtype, path.name, path.name)
    cosine = least_cosine(first, expected)
    tolerance = CPU_TOLERANCE if model.device.type == "cpu" else ACCELERATOR_TOLERANCE
    if diff > tolerance:
        return GoldenResult(
            "failed",
            f"max abs diff {diff:.3g} from {path.name} exceeds {tolerance:g}",
            diff,
            path.name,
            cosine,
            path.name,
        )
    return GoldenResult(
        "passed",
        f"reruns bit-identical; matches {path.name} (max abs diff {diff:.3g})",
        diff,
        path.name,
        cosine,
        path.name,
    )


def least_cosine(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The least cosine similarity between matching rows (in float64)."""
    return float(torch.nn.functional.cosine_similarity(got.double(), expected.double()).min())


def _reduced_precision(
    got: torch.Tensor,
    expected: torch.Tensor,
    diff: float,
    dtype: torch.dtype,
    against: str,
    reference: str | None,
) -> GoldenResult:
    """Compare answers computed at bfloat16/float16 with float32 ones (`against`: the
    reference file's name or FLOAT32_FORWARD)."""
    tolerance, bound = REDUCED_PRECISION[dtype]
    cosine = least_cosine(got, expected)
    at = str(dtype).removeprefix("torch.")
    source = against if reference is not None else "a float32 forward of the same weights"
    if diff > tolerance or cosine < bound:
        origin = f"the float32 {against}" if reference is not None else source
        return GoldenResult(
            "failed",
            f"at {at}: max abs diff {diff:.3g} (bound {tolerance:g}), least cosine"
            f" {cosine:.6f} (bound {bound:g}) from {origin}",
            diff,
            reference,
            cosine,
            against,
        )
    return GoldenResult(
        "passed",
        f"reruns bit-identical; matches {source} at {at} (max abs diff {diff:.3g} <="
        f" {tolerance:g}, least cosine {cosine:.6f} >= {bound:g})",
        diff,
        reference,
        cosine,
        against,
    )
