"""Placement rules of `sr serve`: CLI flags -> a new canonical config.

Pure: every input (config, flags, GPU inventory, environment with the visibility masks)
is an argument, and the result is a new `SrConfig`; the caller validates and writes it.
Every refusal is a `UsageError` with one line that says what to do instead.

Which placement the default deployment gets:
- no `-dp`, `--device-ids` or explicit `--platform`: placements are left as authored;
- target platform cpu: N workers on `cpu`;
- `--device-ids`: host IDs mapped through the masks; one ID takes all N workers, N IDs one
  each; every mapped device must be in the GPU inventory;
- authored placements already on the target GPU platform: resized in declared order,
  cycling (`[rocm:0, rocm:1]` with `-dp 3` -> `[rocm:0, rocm:1, rocm:0]`);
- otherwise (a new GPU placement): the first N available GPUs, or a refusal when fewer
  exist. Workers are never stacked on one card unless `--device-ids` asks for it.
N is `-dp`, else the number of IDs, else the current number of placements.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import attrs

from sr.config.schema import MAX_REPLICAS, Deployment, Listener, Replica, SrConfig
from sr.devices import GPU_PLATFORMS, host_id_to_device, inventory_platform
from sr.errors import UsageError

PLATFORM_CHOICES = ("auto", "cpu", "cuda", "rocm")


@attrs.frozen
class ServeFlags:
    """The config-changing flags of `sr serve`, as typed (IDs still a string)."""

    model: str | None = None
    engine: bool = False
    platform: str = "auto"
    data_parallel: int | None = None
    device_ids: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def places(self) -> bool:
        """Whether any flag asks for a placement change."""
        return (
            self.data_parallel is not None or self.device_ids is not None or self.platform != "auto"
        )


def parse_device_ids(text: str) -> list[int]:
    """`"0,2"` -> [0, 2]: non-negative integers, each at most once."""
    items = [item.strip() for item in text.split(",")]
    if not items or not all(item.isdigit() for item in items):
        raise UsageError(
            f"--device-ids must be comma-separated non-negative integers, got {text!r}"
        )
    ids = [int(item) for item in items]
    for host_id in ids:
        if ids.count(host_id) > 1:
            raise UsageError(
                f"--device-ids lists {host_id} more than once;"
                " use -dp to repeat workers on one GPU (e.g. -dp 2 --device-ids"
                f" {host_id})"
            )
    return ids


def check_data_parallel(n: int) -> None:
    if not 1 <= n <= MAX_REPLICAS:
        raise UsageError(f"-dp must be between 1 and {MAX_REPLICAS}, got {n}")


def resolve_platform(flags: ServeFlags, current: list[Replica], inventory: list[str]) -> str:
    """The platform the placement lands on.

    `auto` keeps a deployment that already sits on one GPU platform there (so resizing
    never depends on the planning host); otherwise it is the inventory's GPU platform,
    or cpu when the inventory has no GPU.
    """
    if flags.platform != "auto":
        if flags.platform not in PLATFORM_CHOICES:
            raise UsageError(
                f"--platform must be one of {', '.join(PLATFORM_CHOICES)}, got {flags.platform!r}"
            )
        return flags.platform
    authored = _platform_of(current)
    if authored in GPU_PLATFORMS:
        return authored
    return inventory_platform(inventory) or "cpu"


def _platform_of(replicas: list[Replica]) -> str | None:
    platforms = {(r.device or "").split(":")[0] for r in replicas}
    return platforms.pop() if len(platforms) == 1 else None


def cycle(replicas: list[Replica], n: int) -> list[Replica]:
    """Resize in declared order, repeating from the start: [a, b] x3 -> [a, b, a]."""
    return [attrs.evolve(replicas[i % len(replicas)]) for i in range(n)]


def place(
    flags: ServeFlags,
    current: list[Replica],
    inventory: list[str],
    env: Mapping[str, str],
) -> list[Replica]:
    """The new managed placements of one deployment (see the module docstring)."""
    if flags.data_parallel is not None:
        check_data_parallel(flags.data_parallel)
    ids = parse_device_ids(flags.device_ids) if flags.device_ids is not None else None
    platform = resolve_platform(flags, current, inventory)
    n = flags.data_parallel or (len(ids) if ids else len(current))

    if ids is not None:
        if platform not in GPU_PLATFORMS:
            raise UsageError(
                "--device-ids requires a GPU platform: no GPU found on this host"
                f" (platform {platform}); pass --platform cuda|rocm or set SR_GPU_INVENTORY"
            )
        if len(ids) not in (1, n):
            raise UsageError(
                f"-dp {n} with {len(ids)} device IDs: give one ID (all {n} workers on that"
                f" GPU) or {n} IDs (one worker each)"
            )
        devices = [host_id_to_device(h, platform, env) for h in ids]
        for host_id, device in zip(ids, devices, strict=True):
            if device not in inventory:
                raise UsageError(
                    f"--device-ids {host_id} maps to {device}, which is not an available GPU"
                    f" (inventory: {', '.join(inventory) or 'none'});"
                    " set SR_GPU_INVENTORY when planning for another host"
                )
        if len(devices) == 1:
            devices = devices * n
        return [Replica(device=d) for d in devices]

    if platform == "cpu":
        return [Replica(device="cpu") for _ in range(n)]
    if _platform_of(current) == platform:
        return cycle(current, n)
    available = [d for d in inventory if d.split(":")[0] == platform]
    if len(available) < n:
        found = f"found {len(available)}: {', '.join(available) or 'none'}"
        if flags.data_parallel is not None:
            raise UsageError(
                f"-dp {n} requires {n} available GPUs; use --device-ids to share a GPU ({found})"
            )
        raise UsageError(
            f"placing {n} workers on {platform} requires {n} available GPUs;"
            f" use -dp to change the count or --device-ids to share a GPU ({found})"
        )
    return [Replica(device=d) for d in available[:n]]


def _apply_listener(cfg: SrConfig, flags: ServeFlags) -> None:
    """`--host`/`--port` land on the first listener, so the file says where sr listens and
    the next start (and `sr inventory`) reads the same address."""
    if flags.host is None and flags.port is None:
        return
    if not cfg.listeners:
        cfg.listeners.append(Listener())
    if flags.host is not None:
        cfg.listeners[0].host = flags.host
    if flags.port is not None:
        cfg.listeners[0].port = flags.port


def apply_flags(
    cfg: SrConfig,
    flags: ServeFlags,
    inventory: list[str],
    env: Mapping[str, str],
) -> SrConfig:
    """A new config with `flags` applied to the default deployment; `cfg` is not changed."""
    new = copy.deepcopy(cfg)
    name = new.default_deployment
    if flags.engine:
        new.global_.router.enabled = False
    _apply_listener(new, flags)
    if flags.model is None and not flags.places:
        return new
    deployment: Deployment | None = new.deployments.get(name)
    if deployment is None:
        raise UsageError(
            f"the default deployment {name!r} (global.model_catalog.system.decision_model"
            ".deployment) is not in the config; edit the config"
        )
    if deployment.attached and (flags.places or flags.model is not None):
        which = "MODEL" if not flags.places else "-dp/--device-ids/--platform"
        raise UsageError(
            f"deployment {name!r} has attached replicas (endpoint); {which} cannot change it:"
            " edit the config"
        )
    if flags.model is not None and flags.model != deployment.artifact:
        deployment.artifact = flags.model
        deployment.revision = None  # a pin names a revision of the previous artifact
        deployment.input.max_tokens = None  # so does a limit: the new folder's is read
    if flags.places:
        deployment.replicas = place(flags, deployment.placements(), inventory, env)
        deployment.device = deployment.endpoint = deployment.model = None
    return new
