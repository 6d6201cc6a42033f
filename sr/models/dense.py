"""sentence-transformers Dense modules, applied to pooled rows before Normalize.

Each module is `activation(x @ weight.T + bias)`, plus `x` (or `x @ residual.weight.T`) with
`use_residual`, in float32, as sentence_transformers.models.Dense computes it. All rows of a
batch go through one product, `Linear.consistent` (sr.models.linear, on the kernel chosen
for the host at float32), which pads them to the short-matrix cut-off of the module's
shape (or sums per row for one output), so a row gets the same bits alone as in any batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from sr.errors import UnsupportedModel
from sr.models.checkpoint import DenseSpec
from sr.models.gemm_rows import ProductKey
from sr.models.kernels import BLAS
from sr.models.linear import Linear, product_keys

# What each torch.nn module of checkpoint.DENSE_ACTIVATIONS computes (default arguments:
# nn.GELU() is the exact erf GELU, as F.gelu).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "Identity": None,
    "Tanh": torch.tanh,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
}


class _Dense:
    __slots__ = ("activation", "linear", "residual", "spec")

    def __init__(self, folder: Path, spec: DenseSpec, device: torch.device, kernel: str):
        file = folder / spec.path / "model.safetensors"
        try:
            tensors = load_file(str(file), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise UnsupportedModel(f"{file}: cannot be read as safetensors: {exc}") from exc
        shapes = {"linear.weight": (spec.out_features, spec.in_features)}
        if spec.bias:
            shapes["linear.bias"] = (spec.out_features,)
        if spec.residual and spec.in_features != spec.out_features:
            shapes["residual.weight"] = (spec.out_features, spec.in_features)
        for name, shape in shapes.items():
            if name not in tensors:
                raise UnsupportedModel(f"{file}: lacks the tensor {name!r}")
            if tuple(tensors[name].shape) != shape:
                raise UnsupportedModel(
                    f"{file}: {name} has shape {tuple(tensors[name].shape)}, config.json "
                    f"(in_features, out_features, bias) says {shape}"
                )
        unexpected = sorted(set(tensors) - set(shapes))
        if unexpected:
            raise UnsupportedModel(f"{file}: unexpected tensors {unexpected}")

        def put(name: str) -> torch.Tensor | None:
            if name not in tensors:
                return None
            return tensors[name].to(device=device, dtype=torch.float32).contiguous()

        self.spec = spec
        self.linear = Linear(put("linear.weight"), put("linear.bias"), kernel=kernel)
        residual = put("residual.weight")
        self.residual = None if residual is None else Linear(residual, kernel=kernel)
        self.activation = ACTIVATIONS[spec.activation]

    def linears(self) -> list[Linear]:
        return [self.linear] if self.residual is None else [self.linear, self.residual]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear.consistent(x)
        if self.activation is not None:
            out = _rowwise(self.activation, out)
        if self.spec.residual:
            out = out + (x if self.residual is None else self.residual.consistent(x))
        return out


class DenseStack:
    """The checkpoint's Dense modules in order; `out_features` is the embedding size (the
    pooled size when there are none)."""

    def __init__(
        self,
        folder: Path,
        specs: tuple[DenseSpec, ...],
        pooled_size: int,
        device: torch.device,
        kernel: str = BLAS,
    ):
        if specs and specs[0].in_features != pooled_size:
            raise UnsupportedModel(
                f"{Path(folder) / specs[0].path / 'config.json'}: in_features "
                f"{specs[0].in_features} does not match the pooled size {pooled_size}"
            )
        self.device = device
        self.layers = [_Dense(Path(folder), spec, device, kernel) for spec in specs]
        self.out_features = specs[-1].out_features if specs else pooled_size

    def __bool__(self) -> bool:
        return bool(self.layers)

    def linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in layer.linears()]

    def calibrate(self) -> None:
        """Measure the short-matrix cut-off of every module's shape at the current thread
        count (once per count), so that no timed forward pays for it."""
        for linear in self.linears():
            linear.cut_off(self.device, torch.float32)

    def product_keys(self) -> set[ProductKey]:
        """What `calibrate` measures (sr.models.linear.product_keys)."""
        return product_keys(self.linears(), torch.float32)

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled [n, pooled_size] -> [n, out_features]. Each product pads its rows to its
        own shape's cut-off (consistent_linear), each activation runs on whole vectors."""
        x = pooled
        for layer in self.layers:
            x = layer(x)
        return x


# torch's vectorised elementwise loops finish a tensor's last, partial vector with a scalar
# loop, and for sigmoid and SiLU the two round differently (measured: a 12-wide row's bits
# changed with the row count at 23-29 of 63 counts). Rows padded to whole iterations of
# the widest loop (2 x 16 floats, twice for margin) are never split between the two.
_WHOLE_VECTORS = 64


def _rowwise(activation, x: torch.Tensor) -> torch.Tensor:
    """activation(x) with each row's bits independent of how many rows x has."""
    width = x.shape[-1]
    pad = -width % _WHOLE_VECTORS
    if not pad:
        return activation(x)
    return activation(F.pad(x, (0, pad)))[..., :width]
