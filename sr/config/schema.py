"""The canonical config resource as attrs classes.

These classes are the in-memory form every other module reads. Loading, dumping and
validation live in `sr.config.load`; placement rules (CLI flags -> replicas) in
`sr.config.placement`. Field names are the YAML keys, except `global` (a Python keyword)
which is `SrConfig.global_` (its YAML key is kept in the field metadata). Field order is
the key order of the canonical dump.
"""

from __future__ import annotations

import attrs

from sr.config.engine import (  # noqa: F401 - the engine's constants, read from here too
    DEFAULT_DTYPE,
    DEFAULT_ENGINE,
    DEFAULT_KERNEL,
    DEPLOYMENT_DTYPES,
    DTYPES,
    ENGINES,
    FLOAT16_REFUSED_ON,
    KERNELS,
    OVERFLOW_MODES,
    PROFILES,
    EngineArgs,
)

EMBEDDED_DEFAULT_ARTIFACT = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_DEPLOYMENT = "primary"
MAX_REPLICAS = 64
EJECTION_CAP_MS = 3_600_000
# The deadline of a deployment without `timeout_ms`: about 11x the worst wait at the
# admission cap measured for the default model on one CPU thread (32 inputs of 256 tokens
# queued on one worker: 2.6 s), so a healthy replica never meets it and a hung one is
# counted and ejected in tens of seconds (docs/decisions.md).
DEFAULT_TIMEOUT_MS = 30_000
PROVIDERS = ("model_runtime",)


def yaml_key(field: attrs.Attribute) -> str:
    """The YAML key of an attrs field (differs from the name only for `global_`)."""
    return field.metadata.get("key", field.name)


@attrs.define
class InputLimits:
    # None: the model folder's own limit (sr.models.limits); `sr serve` writes the number.
    max_tokens: int | None = None
    overflow: str = "reject"  # reject | truncate


@attrs.define
class OutlierDetection:
    consecutive_timeouts: int = 3  # 0 turns ejection off
    base_ejection_ms: int = 30_000
    max_ejection_ms: int | None = None  # default: 10 x base, capped at one hour
    max_ejection_percent: int = 50
    # A caller's own deadline shorter than this (or than the deployment's observed healthy
    # service time, sr.pool.service_times) answers 504 but never counts against a replica.
    min_deadline_ms: int = attrs.field(default=100, metadata={"omit_if_default": True})

    @property
    def effective_max_ejection_ms(self) -> int:
        if self.max_ejection_ms is not None:
            return min(self.max_ejection_ms, EJECTION_CAP_MS)
        return min(10 * self.base_ejection_ms, EJECTION_CAP_MS)


# `discover: "dns://HOST:PORT"` entries (sr.pool.discovery): the schemes a discovered
# address is reached with, and how often the name is resolved again by default.
DISCOVER_SCHEMES = ("dns",)
WORKER_SCHEMES = ("http", "https")
DEFAULT_REFRESH_S = 30


@attrs.define
class Replica:
    """One placement: managed (`device`), attached (`endpoint` + `model`), or a discovered
    fleet of attached workers (`discover` + `model`: one replica per resolved address).

    `api_key_env` names the environment variable holding the key sent to attached workers
    (the key itself never enters a config: sr dumps and rewrites configs); `ca_bundle` is
    the CA file https workers are verified with. `scheme` and `refresh_s` are for
    `discover` only (defaults: http, DEFAULT_REFRESH_S)."""

    device: str | None = None
    endpoint: str | None = None
    discover: str | None = None
    model: str | None = None
    scheme: str | None = None
    api_key_env: str | None = None
    ca_bundle: str | None = None
    refresh_s: int | None = None

    @property
    def attached(self) -> bool:
        return self.endpoint is not None or self.discover is not None

    @property
    def discovered(self) -> bool:
        return self.discover is not None

    @property
    def effective_scheme(self) -> str:
        return self.scheme or "http"

    @property
    def effective_refresh_s(self) -> int:
        return self.refresh_s if self.refresh_s is not None else DEFAULT_REFRESH_S


@attrs.define
class Deployment:
    provider: str = "model_runtime"
    # keyword-only so that it can stay second (canonical key order) without a default
    artifact: str = attrs.field(kw_only=True)
    revision: str | None = None
    profile: str = "exact"
    input: InputLimits = attrs.Factory(InputLimits)
    # None: DEFAULT_TIMEOUT_MS. A wedged forward must end as a counted timeout (and, repeated,
    # an ejection), never hold its callers until each gives up.
    timeout_ms: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # An engine arg like the caps above: omitted from the dump while it is the default.
    dtype: str = attrs.field(default=DEFAULT_DTYPE, metadata={"omit_if_default": True})
    # The kernel of the linear products; omitted from the dump while it is the default.
    kernel: str = attrs.field(default=DEFAULT_KERNEL, metadata={"omit_if_default": True})
    # What computes the backbone (torch or onnxruntime); omitted while it is the default.
    engine: str = attrs.field(default=DEFAULT_ENGINE, metadata={"omit_if_default": True})
    # Single-worker shorthand; mutually exclusive with `replicas`.
    device: str | None = None
    endpoint: str | None = None
    model: str | None = None
    replicas: list[Replica] | None = None
    outlier_detection: OutlierDetection = attrs.Factory(OutlierDetection)

    def engine_args(self) -> EngineArgs:
        """What every worker of this deployment is started with (sr.config.engine)."""
        return EngineArgs(
            artifact=self.artifact,
            revision=self.revision,
            profile=self.profile,
            max_tokens=self.input.max_tokens,
            overflow=self.input.overflow,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            dtype=self.dtype,
            kernel=self.kernel,
            engine=self.engine,
        )

    def placements(self) -> list[Replica]:
        """The normalised replica list: the shorthand is exactly one explicit replica."""
        if self.replicas is not None:
            return list(self.replicas)
        if self.endpoint is not None:
            return [Replica(endpoint=self.endpoint, model=self.model)]
        return [Replica(device=self.device or "cpu")]

    @property
    def attached(self) -> bool:
        """True when any placement is an attached worker (flags cannot resize it)."""
        return any(r.attached for r in self.placements())

    @property
    def fixed_worker_count(self) -> int | None:
        """How many workers serve this deployment; None when a `discover` entry makes
        that vary with what its name resolves to."""
        placements = self.placements()
        return None if any(r.discovered for r in placements) else len(placements)


@attrs.define
class DecisionModel:
    deployment: str = DEFAULT_DEPLOYMENT


@attrs.define
class System:
    decision_model: DecisionModel = attrs.Factory(DecisionModel)


@attrs.define
class ModelCatalog:
    deployments: dict[str, Deployment] = attrs.Factory(dict)
    bindings: dict[str, str] = attrs.Factory(dict)
    system: System = attrs.Factory(System)


@attrs.define
class RouterSettings:
    # sr has no semantic router yet; recorded for vllm-sr compatibility (docs/decisions.md)
    enabled: bool = True


@attrs.define
class GlobalSection:
    router: RouterSettings = attrs.Factory(RouterSettings)
    model_catalog: ModelCatalog = attrs.Factory(ModelCatalog)


@attrs.define
class Listener:
    host: str = "127.0.0.1"
    port: int = 8899
    api_keys: list[str] = attrs.Factory(list)
    # Origins allowed to call from a browser (sr.router.cors); empty: CORS off.
    cors_allow_origins: list[str] = attrs.field(factory=list, metadata={"omit_if_default": True})
    # Host names this listener answers besides loopback ones (sr.router.guard); "*": any.
    # Empty: a loopback listener answers loopback names only, any other listener any name.
    allowed_hosts: list[str] = attrs.field(factory=list, metadata={"omit_if_default": True})


@attrs.define
class SrConfig:
    global_: GlobalSection = attrs.field(factory=GlobalSection, metadata={"key": "global"})
    listeners: list[Listener] = attrs.Factory(lambda: [Listener()])

    @property
    def deployments(self) -> dict[str, Deployment]:
        return self.global_.model_catalog.deployments

    @property
    def default_deployment(self) -> str:
        return self.global_.model_catalog.system.decision_model.deployment


def default_config() -> SrConfig:
    """The config `sr serve` writes when none exists: the embedded default model on cpu."""
    cfg = SrConfig()
    cfg.deployments[DEFAULT_DEPLOYMENT] = Deployment(
        artifact=EMBEDDED_DEFAULT_ARTIFACT, replicas=[Replica(device="cpu")]
    )
    return cfg
