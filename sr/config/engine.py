"""The engine arguments of a deployment: what every worker of it is started with.

`EngineArgs` is the one value that the config (`Deployment.engine_args()`), a replica's
identity (sr.pool.identity), the worker's argv (sr.pool.replica) and the worker's own
options (sr.worker.options.WorkerOptions, a subclass) share. The mapping to and from
`sr worker` flags is derived from its fields, so the two directions cannot drift:
- a field `max_num_seqs` is the flag `--max-num-seqs`; ints parse as int;
- a field whose value is None is left out of the argv (the worker's default is None too);
  so is a field marked `omit_if_default` while it holds its default, which keeps the argv
  (and the identity) of replicas from before that field existed unchanged.
Which values are valid is decided where the deployment is read (sr.config.validate, with
paths) and again by the worker (WorkerOptions.validate, naming flags), from the constants
here.
"""

from __future__ import annotations

import argparse

import attrs

from sr.config.precision import AUTO_DTYPE

# `exact`: rows share a forward only when a load-time probe proves answers bit-identical;
# `throughput`: rows always share forwards (answers may differ in the last bits).
PROFILES = ("exact", "throughput")
OVERFLOW_MODES = ("reject", "truncate")
# The precision workers compute in (`sr worker --dtype`); float16 is served on GPUs only
# (docs/decisions.md). A deployment may also say `auto` (the default, left out of the
# canonical dump and of the worker argv): the profile decides on the worker's host
# (sr.config.precision): float32 under exact, bfloat16 where native under throughput.
DTYPES = ("float32", "bfloat16", "float16")
DEPLOYMENT_DTYPES = (AUTO_DTYPE, *DTYPES)
DEFAULT_DTYPE = AUTO_DTYPE
# The kernel of every linear product (sr.models.linear): `auto` lets the worker's load-time
# probe pick oneDNN's packed weights where they keep `exact`'s guarantees, else BLAS; `blas`
# keeps the weights as the file's shared pages (packed weights are private per replica);
# `onednn` refuses to start where the probe rejects it.
KERNELS = ("auto", "onednn", "blas")
DEFAULT_KERNEL = "auto"
# What computes the backbone: sr's eager torch families, or ONNX Runtime on a graph exported
# from them (sr.models.onnx_engine: float32 on the CPU, with the `onnx` extra installed).
ENGINES = ("torch", "onnxruntime")
DEFAULT_ENGINE = "torch"
ONNX_EXTRA_HINT = "pip install 'sr[onnx]'"
# Devices whose workers refuse float16 (this torch CPU build has no fast float16 matmul).
FLOAT16_REFUSED_ON = ("cpu",)
# `sr worker` refuses --max-tokens below this: a row needs room for its special tokens.
MIN_MAX_TOKENS = 2

_OMIT_IF_DEFAULT = {"omit_if_default": True}


@attrs.frozen
class EngineArgs:
    """How a deployment's workers serve its model (all replicas share these)."""

    artifact: str
    revision: str | None = None
    profile: str = "exact"
    max_tokens: int | None = None  # None: the folder's own limit (sr.models.limits)
    overflow: str = "reject"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = attrs.field(default=DEFAULT_DTYPE, metadata=_OMIT_IF_DEFAULT)
    kernel: str = attrs.field(default=DEFAULT_KERNEL, metadata=_OMIT_IF_DEFAULT)
    engine: str = attrs.field(default=DEFAULT_ENGINE, metadata=_OMIT_IF_DEFAULT)

    def mapped(self) -> dict[str, object]:
        """field -> value for what travels (argv, identity): module docstring's rules."""
        out = {}
        for field in attrs.fields(EngineArgs):
            value = getattr(self, field.name)
            if value is None or value == "":
                continue
            if field.metadata.get("omit_if_default") and value == field.default:
                continue
            out[field.name] = value
        return out

    def argv(self) -> list[str]:
        """The `sr worker` flags that start a worker with these arguments."""
        argv: list[str] = []
        for name, value in self.mapped().items():
            argv += [flag_name(name), str(value)]
        return argv


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineArgs field (module docstring), with the field's default."""
    for field in attrs.fields(EngineArgs):
        kwargs: dict = {"dest": field.name}
        if field.type in ("int", "int | None"):
            kwargs["type"] = int
        if field.default is attrs.NOTHING:
            kwargs["required"] = True
        else:
            kwargs["default"] = field.default
        parser.add_argument(flag_name(field.name), **kwargs)


def onnx_engine_problem(engine: str, dtype: str, kernel: str, devices: list[str]) -> str | None:
    """Why a deployment cannot run on `engine` (None: it can): onnxruntime serves float32
    on the CPU and needs its extra; the worker checks it again, and the config names the
    field."""
    if engine != "onnxruntime":
        return None
    if dtype not in (AUTO_DTYPE, "float32"):
        return f"engine onnxruntime serves float32 only, not {dtype}"
    if kernel == "onednn":
        return "engine onnxruntime runs its torch side on kernel blas, not onednn"
    if any(device != "cpu" for device in devices):
        return "engine onnxruntime serves on the cpu device only"
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return f"engine onnxruntime needs the onnxruntime package ({ONNX_EXTRA_HINT})"
    return None


def engine_from_flags(args: argparse.Namespace) -> dict[str, object]:
    """The EngineArgs fields of parsed flags, as keyword arguments."""
    return {field.name: getattr(args, field.name) for field in attrs.fields(EngineArgs)}
