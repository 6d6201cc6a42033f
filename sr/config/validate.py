"""Semantic validation of a structured config: every rule, every issue, each with its path.

`semantic_issues(cfg)` never raises; it returns the list of `ConfigIssue`s (empty when valid).
Type and unknown-key problems are found earlier, on the raw YAML, by `sr.config.shape`.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from sr.config.engine import MIN_MAX_TOKENS, onnx_engine_problem
from sr.config.schema import (
    DEPLOYMENT_DTYPES,
    DISCOVER_SCHEMES,
    EJECTION_CAP_MS,
    ENGINES,
    FLOAT16_REFUSED_ON,
    KERNELS,
    MAX_REPLICAS,
    OVERFLOW_MODES,
    PROFILES,
    PROVIDERS,
    WORKER_SCHEMES,
    Deployment,
    OutlierDetection,
    Replica,
    SrConfig,
)
from sr.errors import ConfigIssue

# The one device rule: the config and `sr worker --device` both apply `device_error`.
DEVICE_RE = re.compile(r"cpu|(cuda|rocm):(0|[1-9][0-9]{0,3})")
# Names end up in URLs, metric labels and socket paths: keep them plain.
DEPLOYMENT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CATALOG = "global.model_catalog"


def device_error(device: str) -> str | None:
    """Why `device` is not a valid device string, or None when it is."""
    if DEVICE_RE.fullmatch(device):
        return None
    return f"invalid device {device!r}; expected cpu, cuda:N or rocm:N (N a GPU ordinal)"


def endpoint_error(endpoint: str) -> str | None:
    """Why `endpoint` is not an http(s)://host:port URL, or None when it is."""
    split = _split_url("endpoint", endpoint)
    if isinstance(split, str):
        return split
    parts, port = split
    if parts.scheme not in ("http", "https"):
        return f"invalid endpoint {endpoint!r}; expected http://HOST:PORT or https://HOST:PORT"
    if not parts.hostname:
        return f"invalid endpoint {endpoint!r}: missing host"
    return _port_error("endpoint", endpoint, port, "", parts)


def _split_url(kind: str, value: str) -> tuple[SplitResult, int | None] | str:
    """The parts and port of a worker's URL (`kind`: endpoint, discover), or why they
    cannot be read."""
    try:
        parts = urlsplit(value)
        return parts, parts.port
    except ValueError as exc:
        return f"invalid {kind} {value!r}: {exc}"


def _port_error(
    kind: str, value: str, port: int | None, why: str, parts: SplitResult
) -> str | None:
    """Why a worker's URL has no usable port (`why` says what the port is), or carries
    what a worker's address must not (credentials, a query, a fragment)."""
    if port is None:
        return f"invalid {kind} {value!r}: missing port{why} (e.g. {value.rstrip('/')}:8100)"
    if port == 0:
        return f"invalid {kind} {value!r}: port must be 1..65535"
    if parts.username or parts.password or parts.query or parts.fragment:
        return f"invalid {kind} {value!r}: credentials, query and fragment are not allowed"
    return None


# An environment variable's name (POSIX portable names).
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_REFRESH_S = 86_400


def discover_error(discover: str) -> str | None:
    """Why `discover` is not a dns://HOST:PORT name to resolve, or None when it is."""
    split = _split_url("discover", discover)
    if isinstance(split, str):
        return split
    parts, port = split
    if parts.scheme not in DISCOVER_SCHEMES:
        return (
            f"invalid discover {discover!r}: unknown scheme {parts.scheme or '(none)'!r};"
            " expected dns://HOST:PORT"
        )
    if not parts.hostname:
        return f"invalid discover {discover!r}: missing host; expected dns://HOST:PORT"
    if error := _port_error("discover", discover, port, ", the port the workers listen on", parts):
        return error
    if parts.path not in ("", "/"):
        return f"invalid discover {discover!r}: a path is not allowed; expected dns://HOST:PORT"
    return None


def _positive(value: int | None, path: str, issues: list[ConfigIssue]) -> None:
    if value is not None and value <= 0:
        issues.append(ConfigIssue(path, f"must be a positive integer, got {value}"))


def _argv_value_error(value: str) -> str | None:
    """Why `value` cannot travel as a `sr worker` flag value, or None when it can."""
    if value.startswith("-"):
        # argparse would read it as a flag, and the worker would refuse its arguments
        return f"must not start with '-', got {value!r}"
    if "\0" in value:
        return "must not contain a NUL character"
    return None


def _check_replica(replica: Replica, artifact: str, path: str, issues: list[ConfigIssue]) -> None:
    kinds = [k for k in ("device", "endpoint", "discover") if getattr(replica, k) is not None]
    if kinds == ["device", "endpoint"]:
        issues.append(
            ConfigIssue(
                path, "a replica has either device (managed) or endpoint (attached), not both"
            )
        )
    elif len(kinds) > 1:
        issues.append(
            ConfigIssue(
                path,
                "a replica has one of device (managed), endpoint (attached) or discover"
                f" (discovered attached workers), got {' and '.join(kinds)}",
            )
        )
    elif not kinds:
        issues.append(
            ConfigIssue(path, "a replica needs device (managed) or endpoint + model (attached)")
        )
    if replica.device is not None and (err := device_error(replica.device)):
        issues.append(ConfigIssue(f"{path}.device", err))
    if replica.endpoint is not None and (err := endpoint_error(replica.endpoint)):
        issues.append(ConfigIssue(f"{path}.endpoint", err))
    if replica.discover is not None and (err := discover_error(replica.discover)):
        issues.append(ConfigIssue(f"{path}.discover", err))
    if replica.attached:
        kind = "endpoint" if replica.endpoint is not None else "discover"
        if not replica.model:
            issues.append(ConfigIssue(f"{path}.model", f"an attached replica ({kind}) needs model"))
        elif replica.model != artifact:
            issues.append(
                ConfigIssue(
                    f"{path}.model",
                    f"attached model {replica.model!r} differs from the deployment's artifact"
                    f" {artifact!r}; all replicas of a deployment share the artifact",
                )
            )
    elif replica.model is not None:
        issues.append(
            ConfigIssue(f"{path}.model", "model applies only to an attached replica (endpoint)")
        )
    _check_worker_access(replica, path, issues)


def _check_worker_access(replica: Replica, path: str, issues: list[ConfigIssue]) -> None:
    """scheme, api_key_env, ca_bundle and refresh_s: how attached workers are reached."""
    if replica.scheme is not None:
        if replica.discover is None:
            issues.append(ConfigIssue(f"{path}.scheme", "scheme applies only to discover"))
        elif replica.scheme not in WORKER_SCHEMES:
            issues.append(
                ConfigIssue(
                    f"{path}.scheme",
                    f"unknown scheme {replica.scheme!r}; one of {', '.join(WORKER_SCHEMES)}",
                )
            )
    if replica.refresh_s is not None:
        if replica.discover is None:
            issues.append(ConfigIssue(f"{path}.refresh_s", "refresh_s applies only to discover"))
        elif not 1 <= replica.refresh_s <= MAX_REFRESH_S:
            issues.append(
                ConfigIssue(
                    f"{path}.refresh_s",
                    f"must be 1..{MAX_REFRESH_S} seconds, got {replica.refresh_s}",
                )
            )
    if replica.api_key_env is not None:
        if not replica.attached:
            issues.append(
                ConfigIssue(
                    f"{path}.api_key_env", "api_key_env applies only to endpoint or discover"
                )
            )
        elif not ENV_NAME_RE.fullmatch(replica.api_key_env):
            issues.append(
                ConfigIssue(
                    f"{path}.api_key_env",
                    "expected the name of an environment variable (letters, digits, '_'),"
                    f" got {replica.api_key_env!r}; the key itself never goes in a config",
                )
            )
    if replica.ca_bundle is not None:
        https = (replica.discover is not None and replica.scheme == "https") or (
            replica.endpoint is not None and replica.endpoint.startswith("https://")
        )
        if not https:
            issues.append(
                ConfigIssue(
                    f"{path}.ca_bundle",
                    "ca_bundle applies only to https workers (an https:// endpoint,"
                    " or discover with scheme: https)",
                )
            )
        elif not replica.ca_bundle.strip():
            issues.append(ConfigIssue(f"{path}.ca_bundle", "must not be empty"))


def _check_outlier(od: OutlierDetection, path: str, issues: list[ConfigIssue]) -> None:
    if od.consecutive_timeouts < 0:
        issues.append(
            ConfigIssue(
                f"{path}.consecutive_timeouts",
                f"must be 0 (ejection off) or more, got {od.consecutive_timeouts}",
            )
        )
    for name, low in (("base_ejection_ms", 1), ("min_deadline_ms", 0)):
        value = getattr(od, name)
        if not low <= value <= EJECTION_CAP_MS:
            issues.append(
                ConfigIssue(f"{path}.{name}", f"must be {low}..{EJECTION_CAP_MS}, got {value}")
            )
    if od.max_ejection_ms is not None:
        if od.max_ejection_ms > EJECTION_CAP_MS:
            issues.append(
                ConfigIssue(
                    f"{path}.max_ejection_ms",
                    f"must be at most {EJECTION_CAP_MS} (one hour), got {od.max_ejection_ms}",
                )
            )
        elif od.max_ejection_ms < od.base_ejection_ms:
            issues.append(
                ConfigIssue(
                    f"{path}.max_ejection_ms",
                    f"must be at least base_ejection_ms ({od.base_ejection_ms}),"
                    f" got {od.max_ejection_ms}",
                )
            )
    if not 0 <= od.max_ejection_percent <= 100:
        issues.append(
            ConfigIssue(
                f"{path}.max_ejection_percent", f"must be 0..100, got {od.max_ejection_percent}"
            )
        )


def _check_dtype(dep: Deployment, path: str, issues: list[ConfigIssue]) -> None:
    if dep.dtype not in DEPLOYMENT_DTYPES:
        known = ", ".join(DEPLOYMENT_DTYPES)
        issues.append(ConfigIssue(path, f"unknown dtype {dep.dtype!r}; one of {known}"))
        return
    # Mirrors `sr worker`, which refuses float16 on cpu (sr/worker/options.py).
    refused = sorted(
        {r.device for r in dep.placements() if r.device in FLOAT16_REFUSED_ON and not r.attached}
    )
    if dep.dtype == "float16" and refused:
        issues.append(
            ConfigIssue(
                path,
                f"float16 is not served on {', '.join(refused)} (CPU float16 matmul is several"
                " times slower than float32 in this torch build); use bfloat16 or float32,"
                " or place the replicas on GPUs",
            )
        )


def _check_deployment(dep: Deployment, path: str, issues: list[ConfigIssue]) -> None:
    if dep.provider not in PROVIDERS:
        issues.append(
            ConfigIssue(f"{path}.provider", f"unknown provider {dep.provider!r}; use model_runtime")
        )
    if not dep.artifact.strip():
        issues.append(ConfigIssue(f"{path}.artifact", "must not be empty"))
    elif err := _argv_value_error(dep.artifact):
        issues.append(ConfigIssue(f"{path}.artifact", err))
    if dep.revision and (err := _argv_value_error(dep.revision)):
        issues.append(ConfigIssue(f"{path}.revision", err))
    if dep.profile not in PROFILES:
        issues.append(
            ConfigIssue(
                f"{path}.profile", f"unknown profile {dep.profile!r}; one of {', '.join(PROFILES)}"
            )
        )
    if dep.input.max_tokens is not None and dep.input.max_tokens < MIN_MAX_TOKENS:
        issues.append(
            ConfigIssue(
                f"{path}.input.max_tokens",
                f"must be at least {MIN_MAX_TOKENS} (workers refuse fewer),"
                f" got {dep.input.max_tokens}",
            )
        )
    if dep.input.overflow not in OVERFLOW_MODES:
        issues.append(
            ConfigIssue(
                f"{path}.input.overflow",
                f"unknown overflow {dep.input.overflow!r}; one of {', '.join(OVERFLOW_MODES)}",
            )
        )
    for name in ("timeout_ms", "max_num_seqs", "max_num_batched_tokens"):
        _positive(getattr(dep, name), f"{path}.{name}", issues)
    _check_dtype(dep, f"{path}.dtype", issues)
    if dep.kernel not in KERNELS:
        issues.append(
            ConfigIssue(
                f"{path}.kernel", f"unknown kernel {dep.kernel!r}; one of {', '.join(KERNELS)}"
            )
        )
    if dep.engine not in ENGINES:
        issues.append(
            ConfigIssue(
                f"{path}.engine", f"unknown engine {dep.engine!r}; one of {', '.join(ENGINES)}"
            )
        )
    elif not dep.attached:
        devices = [replica.device or "cpu" for replica in dep.placements()]
        problem = onnx_engine_problem(dep.engine, dep.dtype, dep.kernel, devices)
        if problem is not None:
            issues.append(ConfigIssue(f"{path}.engine", problem))
    budget = dep.max_num_batched_tokens
    max_tokens = dep.input.max_tokens
    if budget is not None and max_tokens is not None and 0 < budget < max_tokens:
        issues.append(
            ConfigIssue(
                f"{path}.max_num_batched_tokens",
                f"must be at least input.max_tokens ({dep.input.max_tokens}) so that one"
                f" full-length input fits a batch, got {budget}",
            )
        )
    if dep.replicas is not None:
        for key in ("device", "endpoint", "model"):
            if getattr(dep, key) is not None:
                issues.append(
                    ConfigIssue(
                        f"{path}.{key}",
                        f"deployment-level {key} cannot be combined with replicas;"
                        " move it into a replica",
                    )
                )
        if not dep.replicas:
            issues.append(ConfigIssue(f"{path}.replicas", "must list at least one replica"))
        if len(dep.replicas) > MAX_REPLICAS:
            issues.append(
                ConfigIssue(
                    f"{path}.replicas",
                    f"at most {MAX_REPLICAS} replicas per deployment, got {len(dep.replicas)}",
                )
            )
        seen_discover: set[str] = set()
        for i, replica in enumerate(dep.replicas):
            _check_replica(replica, dep.artifact, f"{path}.replicas[{i}]", issues)
            if replica.discover is not None:
                if replica.discover in seen_discover:
                    issues.append(
                        ConfigIssue(
                            f"{path}.replicas[{i}].discover",
                            f"{replica.discover!r} is discovered twice in this deployment;"
                            " one entry already adds every address it resolves to",
                        )
                    )
                seen_discover.add(replica.discover)
    else:
        # The shorthand is one replica whose keys sit on the deployment itself.
        shorthand = Replica(device=dep.device, endpoint=dep.endpoint, model=dep.model)
        if shorthand.device is None and shorthand.endpoint is None:
            shorthand.device = "cpu"  # neither given: one worker on cpu
        _check_replica(shorthand, dep.artifact, path, issues)
    _check_outlier(dep.outlier_detection, f"{path}.outlier_detection", issues)


def _check_platforms(cfg: SrConfig, issues: list[ConfigIssue]) -> None:
    """Managed workers all run on this host, which has one GPU platform."""
    platforms = {
        r.device.split(":")[0]
        for dep in cfg.deployments.values()
        for r in dep.placements()
        if r.device and r.device.startswith(("cuda:", "rocm:"))
    }
    if len(platforms) > 1:
        issues.append(
            ConfigIssue(
                f"{CATALOG}.deployments",
                "managed replicas mix cuda and rocm devices; one host runs one GPU platform",
            )
        )


def semantic_issues(cfg: SrConfig) -> list[ConfigIssue]:
    """Every semantic problem of `cfg`, each with its path; empty when it is valid."""
    issues: list[ConfigIssue] = []
    catalog = cfg.global_.model_catalog
    if not catalog.deployments:
        issues.append(ConfigIssue(f"{CATALOG}.deployments", "at least one deployment is required"))
    for name, dep in catalog.deployments.items():
        path = f"{CATALOG}.deployments.{name}"
        if not DEPLOYMENT_NAME_RE.fullmatch(name):
            issues.append(
                ConfigIssue(
                    path,
                    "deployment names are 1-64 letters, digits, '.', '_' or '-',"
                    " starting with a letter or digit",
                )
            )
        _check_deployment(dep, path, issues)
    _check_platforms(cfg, issues)
    known = sorted(catalog.deployments)
    for consumer, target in catalog.bindings.items():
        if not consumer:
            issues.append(ConfigIssue(f"{CATALOG}.bindings", "binding names must not be empty"))
        if target not in catalog.deployments:
            issues.append(
                ConfigIssue(
                    f"{CATALOG}.bindings.{consumer}",
                    f"unknown deployment {target!r}; known: {', '.join(known) or 'none'}",
                )
            )
    decision = catalog.system.decision_model.deployment
    if catalog.deployments and decision not in catalog.deployments:
        issues.append(
            ConfigIssue(
                f"{CATALOG}.system.decision_model.deployment",
                f"unknown deployment {decision!r}; known: {', '.join(known)}",
            )
        )
    _check_listeners(cfg, issues)
    return issues


def _check_listeners(cfg: SrConfig, issues: list[ConfigIssue]) -> None:
    # The router binds exactly one address; a second listener would be
    # silently ignored, and none would silently serve the default with no api_keys.
    if len(cfg.listeners) != 1:
        issues.append(
            ConfigIssue(
                "listeners",
                f"exactly one listener is supported, got {len(cfg.listeners)}",
            )
        )
    for i, listener in enumerate(cfg.listeners):
        path = f"listeners[{i}]"
        if not listener.host.strip():
            issues.append(ConfigIssue(f"{path}.host", "must not be empty"))
        # 0 asks the OS for a free port (tests, embedding); see docs/decisions.md
        if not 0 <= listener.port <= 65535:
            issues.append(ConfigIssue(f"{path}.port", f"must be 0..65535, got {listener.port}"))
        for j, key in enumerate(listener.api_keys):
            if not key.strip():
                issues.append(ConfigIssue(f"{path}.api_keys[{j}]", "api keys must not be empty"))
        for j, origin in enumerate(listener.cors_allow_origins):
            why = _origin_problem(origin)
            if why is not None:
                issues.append(ConfigIssue(f"{path}.cors_allow_origins[{j}]", why))
        for j, name in enumerate(listener.allowed_hosts):
            why = _host_name_problem(name)
            if why is not None:
                issues.append(ConfigIssue(f"{path}.allowed_hosts[{j}]", why))


# A Host header's name: DNS labels, an IPv4 address, or a bracketed IPv6 address. The guard
# compares names without their port, so an entry with a port or a scheme could never match.
_HOST_NAME = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?\.?)+|\[[0-9A-Fa-f:.]+\]")


def _host_name_problem(name: str) -> str | None:
    """Why `name` is not "*" or a host name without a port, or None."""
    if name == "*" or (len(name) <= 253 and _HOST_NAME.fullmatch(name)):
        return None
    return f'expected "*" or a host name without scheme or port (api.example.com), got {name!r}'


def _origin_problem(origin: str) -> str | None:
    """Why `origin` is not "*" or a browser origin (scheme://host[:port]), or None."""
    if origin == "*":
        return None
    parts = urlsplit(origin)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        return f'expected "*" or an origin like https://app.example.com[:port], got {origin!r}'
    return None
