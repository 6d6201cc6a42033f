"""The linear products of every family: one `Linear` per weight, one place that picks the
kernel for the host (`choose_kernel`).

Rules:
* The kernel (sr.models.kernels) is chosen once per process, device and dtype: oneDNN's
  packed linear where it is available (CPU, float32, or bfloat16 with native support) and
  the probe passes: on a few shapes, its rows are bit-identical to the same rows of a
  longer product from some row count under PROBE_ROWS on (the worker pads to that count,
  as it does for BLAS), and its bits are the same at 1 thread, at 2 and at the count in
  force (thread shadows compare counts bit for bit). Otherwise BLAS (`F.linear`), with the
  reason; the choice and its reason go to the worker's card. `kernel="blas"` forces BLAS
  (tests, and hosts where packing is unwanted); it is a parameter, never the environment.
* A model whose hidden size is under MIN_ONEDNN_HIDDEN gets BLAS (`for_model`) unless
  oneDNN is asked for by name: its products are too small to pay oneDNN's per-call cost.
* A product of several weights joined along the outputs (q/k/v, GeGLU's or SwiGLU's two
  inputs) is one product of the joined weight on oneDNN (1.5x three products at 10 rows)
  and one product per part, joined, on BLAS (faster on MKL; the parts stay as stored).
* Only the erf GELU is fused into a product; a residual add is fused on oneDNN (its
  epilogue adds after the bias, bit-identical to a separate add).
* `consistent(x)`: a product whose rows have the same bits whatever the row count, for
  products outside the padded forward (Dense modules, heads): padded to the kernel's
  cut-off for its shape, and a single output as a per-row sum on every kernel (BLAS's
  matrix-vector path has no cut-off at all; measured on MKL: rows differ at 193 of 299
  row counts).
"""

from __future__ import annotations

import threading

import attrs
import torch
import torch.nn.functional as F

from sr.models import kernels
from sr.models.gemm_rows import PROBE_ROWS, ProductKey, min_consistent_rows, threads_agree
from sr.models.kernels import BLAS, ONEDNN

# Shapes of the host probe: a small encoder's products (MiniLM's), cheap to run.
_PROBE_SHAPES = ((384, 384), (384, 1536), (1536, 384))
# Fewest rows a padded forward runs, whatever the kernel's cut-off: on a single row a view
# such as GeGLU's or SwiGLU's halves of one product is contiguous, and torch's elementwise
# loops then take another path than on 2 or more rows, with other bits (measured: GELU x
# gate of a [1, W] half differs from the same row in a [T, W] half at T = 1 only, every
# width tried). BLAS never went below 4 rows; oneDNN's cut-off is 1-2.
MIN_ROWS = 2


@attrs.frozen
class KernelChoice:
    """The kernel serving a model's linear products, and why."""

    linear: str
    reason: str

    def card(self) -> dict[str, str]:
        return {"linear": self.linear, "reason": self.reason}


_lock = threading.Lock()
_choices: dict[tuple[str, torch.dtype], KernelChoice] = {}


# oneDNN's entry point costs ~20 us per call where F.linear costs ~5: below this hidden size a
# model's products are too small for the packed kernel to pay for it. Measured at 1 thread
# (hidden -> 4 x hidden, 10 and 120 rows, BLAS time / oneDNN time): hidden 32 0.22-0.55x,
# 64 0.60-0.75x, 128 0.76-1.11x, 192 1.11-1.19x, 256 1.16-1.32x, 384 1.16-1.66x.
MIN_ONEDNN_HIDDEN = 192


def for_model(choice: KernelChoice, hidden_size: int, asked: str | None) -> KernelChoice:
    """The host's choice for one model: BLAS for models too small for oneDNN to pay,
    unless oneDNN was asked for by name."""
    if choice.linear == ONEDNN and asked is None and hidden_size < MIN_ONEDNN_HIDDEN:
        return KernelChoice(
            BLAS, f"F.linear: hidden size {hidden_size} is under {MIN_ONEDNN_HIDDEN}, where "
            "oneDNN's per-call cost outweighs its faster products",
        )  # fmt: skip
    return choice


def choose_kernel(
    device: torch.device, dtype: torch.dtype = torch.float32, kernel: str | None = None
) -> KernelChoice:
    """The kernel for `device` and `dtype`: `kernel` when given ("blas" always serves;
    "onednn" raises ValueError where it cannot), else probed once per process."""
    if kernel not in (None, *kernels.KERNELS):
        raise ValueError(f"kernel {kernel!r} is not one of {', '.join(kernels.KERNELS)}")
    if kernel == BLAS:
        return KernelChoice(BLAS, "F.linear, as asked")
    key = (str(device), dtype)
    with _lock:
        choice = _choices.get(key)
        if choice is None:
            choice = _choices[key] = _probe(device, dtype)
    if kernel == ONEDNN and choice.linear != ONEDNN:
        raise ValueError(f"the oneDNN kernel cannot serve here: {choice.reason}")
    return choice


def adopt_choice(device: torch.device, dtype: torch.dtype, choice: KernelChoice) -> None:
    """Take `choice` as this process's probe result for `device` and `dtype`: for a process
    that must not run the probe's threads itself (sr.worker.model_server probes in a child)."""
    with _lock:
        _choices[(str(device), dtype)] = choice


def _probe(device: torch.device, dtype: torch.dtype) -> KernelChoice:
    unavailable = kernels.onednn_unavailable(device, dtype)
    if unavailable is not None:
        return KernelChoice(BLAS, unavailable)
    kernels.bound_onednn_caches()
    cut_offs = []
    try:
        for in_features, out_features in _PROBE_SHAPES:
            cut_off = min_consistent_rows(device, in_features, out_features, ONEDNN, dtype)
            if cut_off >= PROBE_ROWS:
                return KernelChoice(
                    BLAS, f"oneDNN's rows depend on the row count ({in_features}x{out_features})"
                )
            if not threads_agree(device, in_features, out_features, ONEDNN, dtype):
                return KernelChoice(BLAS, "oneDNN's bits depend on the thread count")
            cut_offs.append(cut_off)
    except RuntimeError as error:  # oneDNN refuses the ISA or shape
        return KernelChoice(BLAS, f"oneDNN failed: {error}".splitlines()[0])
    return KernelChoice(
        ONEDNN,
        f"oneDNN packed weights: rows consistent from {max(cut_offs)} row(s) on, "
        "same bits at 1 and 2 threads",
    )


Parts = list[tuple[torch.Tensor, torch.Tensor | None]]


class Linear:
    """`act(x @ weight.T + bias) [+ residual]` on the chosen kernel, for one weight or
    for several joined along the outputs (`Linear.joined`)."""

    __slots__ = ("activation", "bias", "in_features", "kernel", "out_features", "parts", "weight")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        kernel: str,
        activation: str | None = None,
    ):
        self._build([(weight, bias)], kernel, activation)

    @classmethod
    def joined(cls, parts: Parts, *, kernel: str) -> Linear:
        """One product whose outputs are each part's outputs side by side."""
        linear = cls.__new__(cls)
        linear._build(list(parts), kernel, None)
        return linear

    def _build(self, parts: Parts, kernel: str, activation: str | None) -> None:
        if activation not in (None, *kernels.FUSED_ACTIVATIONS):
            raise ValueError(f"activation {activation!r} cannot be fused into a product")
        if len({b is None for _, b in parts}) != 1:
            raise ValueError("either every part has a bias or none has")
        weights = [w for w, _ in parts]
        self.in_features = weights[0].shape[1]
        self.out_features = sum(w.shape[0] for w in weights)
        self.activation = activation
        if self.out_features == 1:
            # A single output is a per-row sum on every kernel (see `consistent`).
            kernel = BLAS
        self.kernel = kernel
        if kernel == BLAS and len(parts) > 1:
            # One product per part, joined: the parts stay as the family stored them.
            self.parts: Parts | None = parts
            self.weight = self.bias = None
            return
        self.parts = None
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        biases = [b for _, b in parts if b is not None]
        self.bias = None if not biases else biases[0] if len(biases) == 1 else torch.cat(biases)
        # oneDNN keeps only its reordered copy; the stored weight is no longer referenced.
        self.weight = kernels.prepare(kernel, weight)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.parts is not None:
            if torch._C._is_tracing():  # torch.jit.is_tracing() less two Python calls
                # One product for the ONNX exporter (sr.models.onnx_engine): the parts'
                # weights joined are one constant in the graph, where ORT fuses more.
                weights, biases = zip(*self.parts, strict=True)
                bias = None if biases[0] is None else torch.cat(biases)
                out = F.linear(x, torch.cat(weights), bias)
                return out if residual is None else out + residual
            out = torch.cat([F.linear(x, w, b) for w, b in self.parts], dim=-1)
            return out if residual is None else out + residual
        return kernels.linear(self.kernel, x, self.weight, self.bias, self.activation, residual)

    def shapes(self) -> list[tuple[int, int]]:
        """(in, out) of each product this runs: the parts' on BLAS, else the joined one."""
        if self.parts is not None:
            return [(w.shape[1], w.shape[0]) for w, _ in self.parts]
        return [(self.in_features, self.out_features)]

    def cut_off(self, device: torch.device, dtype: torch.dtype) -> int:
        """Rows from which this product's rows, and the elementwise steps after it, do
        not depend on the row count (measured once per thread count and shape; at least
        MIN_ROWS). A single output's per-row sum needs no padding."""
        if self.out_features == 1:
            return 1
        return max(
            MIN_ROWS,
            *(
                min_consistent_rows(device, n_in, n_out, self.kernel, dtype)
                for n_in, n_out in self.shapes()
            ),
        )

    def consistent(self, x: torch.Tensor) -> torch.Tensor:
        """`self(x)` with each row's bits independent of how many rows x has."""
        if self.out_features == 1:
            out = (x * self.weight[0]).sum(dim=-1, keepdim=True)
            out = out if self.bias is None else out + self.bias
            return F.gelu(out) if self.activation == "gelu" else out
        rows = x.shape[0]
        pad = self.cut_off(x.device, x.dtype) - rows
        if pad > 0:
            x = F.pad(x, (0, 0, 0, pad))
        out = self(x)
        return out[:rows] if pad > 0 else out


def product_keys(linears: list[Linear], dtype: torch.dtype) -> set[ProductKey]:
    """(in_features, out_features, kernel, dtype) of every product of `linears` that has
    a cut-off to measure (sr.models.gemm_rows.measure_many)."""
    return {
        (n_in, n_out, linear.kernel, dtype)
        for linear in linears
        if linear.out_features != 1
        for n_in, n_out in linear.shapes()
    }


def cut_off(linears: list[Linear], device: torch.device, dtype: torch.dtype) -> int:
    """The largest cut-off of these products: a forward padded to it keeps every row's
    bits whatever the batch."""
    return max((linear.cut_off(device, dtype) for linear in linears), default=1)
