"""What this host offers: GPU inventory (with visibility masks) and the CPU budget.

Discovery is cheap and never fatal: it reads device nodes and sysfs, asks torch only
when torch is already imported, and reports no GPUs rather than failing. An explicit
`SR_GPU_INVENTORY` (`rocm:0,1`, `cuda:0,1,2`, empty for none) replaces discovery, for
planning a config away from its target host and for tests; a malformed one is a usage
error because the user asked for it.

Visibility masks: `CUDA_VISIBLE_DEVICES` for CUDA; for ROCm, `ROCR_VISIBLE_DEVICES` is
applied first and `HIP_VISIBLE_DEVICES` (or, when unset, `CUDA_VISIBLE_DEVICES`, which
HIP also honours) then indexes into what ROCR left. Runtime ordinals are positions in
the resulting list of host IDs.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from sr.errors import UsageError

GPU_PLATFORMS = ("cuda", "rocm")
INVENTORY_ENV = "SR_GPU_INVENTORY"


# ---- visibility masks -------------------------------------------------------------------


def mask_variables(platform: str, env: Mapping[str, str]) -> list[str]:
    """The mask variables in force for `platform`, in the order the runtime applies them."""
    if platform == "cuda":
        names = ["CUDA_VISIBLE_DEVICES"]
    elif platform == "rocm":
        hip = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
        names = ["ROCR_VISIBLE_DEVICES", hip]
    else:
        return []
    return [name for name in names if name in env]


def _mask_entries(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def visible_host_ids(platform: str, env: Mapping[str, str]) -> list[int] | None:
    """Host GPU IDs in runtime-ordinal order under the masks; None when no mask is set.

    Raises UsageError for a mask that is not a list of integers (e.g. GPU UUIDs), since
    host IDs cannot be mapped through it.
    """
    visible: list[int] | None = None
    for name in mask_variables(platform, env):
        entries = _mask_entries(env[name])
        if not all(e.isdigit() for e in entries):
            raise UsageError(
                f"cannot map --device-ids through {name}={env[name]!r}:"
                " only comma-separated integer indices are supported"
            )
        ids = [int(e) for e in entries]
        visible = ids if visible is None else [visible[i] for i in ids if i < len(visible)]
    return visible


def host_id_to_device(host_id: int, platform: str, env: Mapping[str, str]) -> str:
    """Map a host GPU index to the runtime device string (`rocm:1` for host 3 under `7,3`)."""
    visible = visible_host_ids(platform, env)
    if visible is None:
        return f"{platform}:{host_id}"
    if host_id not in visible:
        masks = ", ".join(f"{n}={env[n]}" for n in mask_variables(platform, env))
        shown = ", ".join(map(str, visible)) or "none"
        raise UsageError(
            f"--device-ids {host_id}: host GPU {host_id} is not visible under {masks}"
            f" (visible host GPUs: {shown})"
        )
    return f"{platform}:{visible.index(host_id)}"


def _visible_count(platform: str, host_count: int, env: Mapping[str, str]) -> int:
    names = mask_variables(platform, env)
    if not names:
        return host_count
    try:
        visible = visible_host_ids(platform, env)
    except UsageError:
        # UUID-style masks: each entry exposes one device, as far as we can tell
        return min(host_count, len(_mask_entries(env[names[-1]])))
    return len([h for h in visible or [] if h < host_count])


# ---- GPU inventory ----------------------------------------------------------------------


def parse_inventory(spec: str) -> list[str]:
    """`rocm:0,1` or `rocm:0,rocm:1` -> ["rocm:0", "rocm:1"]; empty or `none` -> []."""
    spec = spec.strip()
    if spec.lower() in ("", "none", "cpu"):
        return []
    devices: list[str] = []
    platform = None
    for item in (i.strip() for i in spec.split(",")):
        match = re.fullmatch(r"(?:(cuda|rocm):)?(0|[1-9][0-9]*)", item)
        if match is None or (match.group(1) is None and platform is None):
            raise UsageError(
                f"{INVENTORY_ENV}={spec!r}: expected e.g. rocm:0,1 or cuda:0,1,2 (or empty)"
            )
        if match.group(1) and platform and match.group(1) != platform:
            raise UsageError(f"{INVENTORY_ENV}={spec!r}: mixes GPU platforms")
        platform = match.group(1) or platform
        device = f"{platform}:{match.group(2)}"
        if device in devices:
            raise UsageError(f"{INVENTORY_ENV}={spec!r}: lists {device} twice")
        devices.append(device)
    return devices


def _count(paths: Iterator[Path]) -> int:
    try:
        return sum(1 for _ in paths)
    except OSError:
        return 0


def _nvidia_host_count(root: Path) -> int:
    gpus = root / "proc/driver/nvidia/gpus"
    if gpus.is_dir():
        return _count(gpus.iterdir())
    dev = root / "dev"
    return _count(p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", p.name))


def _amd_host_count(root: Path) -> int:
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    if nodes.is_dir():
        count = 0
        for node in nodes.iterdir():
            try:
                if (node / "gpu_id").read_text().strip() not in ("", "0"):  # 0 = CPU node
                    count += 1
            except OSError:
                continue
        return count
    if (root / "dev/kfd").exists():
        return _count((root / "dev/dri").glob("renderD*"))
    return 0


def _torch_inventory() -> list[str]:
    torch = sys.modules.get("torch")
    if torch is None:  # importing torch only to count GPUs would cost seconds
        return []
    try:
        count = torch.cuda.device_count()  # already honours the masks
        platform = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    except Exception:
        return []
    return [f"{platform}:{i}" for i in range(count)]


def gpu_inventory(env: Mapping[str, str], *, root: Path = Path("/")) -> list[str]:
    """Runtime device strings of the GPUs this process can use, e.g. ["rocm:0", "rocm:1"],
    from `env` (sr.settings' snapshot): SR_GPU_INVENTORY, else /dev and the masks."""
    if INVENTORY_ENV in env:
        return parse_inventory(env[INVENTORY_ENV])
    try:
        for platform, host_count in (
            ("cuda", _nvidia_host_count(root)),
            ("rocm", _amd_host_count(root)),
        ):
            if host_count:
                count = _visible_count(platform, host_count, env)
                return [f"{platform}:{i}" for i in range(count)]
    except OSError:
        pass
    return _torch_inventory()


def inventory_platform(inventory: list[str]) -> str | None:
    """The GPU platform of an inventory (`cuda`/`rocm`), or None when it has no GPU."""
    for device in inventory:
        platform = device.split(":")[0]
        if platform in GPU_PLATFORMS:
            return platform
    return None


# ---- CPU budget -------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_dirs(mount: Path, relative: str) -> Iterator[Path]:
    """The process's cgroup directory and its ancestors up to the mount (limits nest)."""
    leaf = mount / relative.lstrip("/")
    if not leaf.is_dir():  # a cgroup namespace shows our own cgroup at the mount root
        yield mount
        return
    current = leaf
    while True:
        yield current
        if current == mount or mount not in current.parents:
            return
        current = current.parent


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    parts = text.split()
    if parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota_text = _read(directory / "cpu.cfs_quota_us")
    period_text = _read(directory / "cpu.cfs_period_us")
    try:
        quota, period = int(quota_text or "-1"), int(period_text or "0")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None  # -1 = unlimited


def cgroup_cpu_limit(root: Path = Path("/")) -> float | None:
    """The CPU quota (in CPUs) of this process's cgroup, v2 or v1; None when unlimited."""
    cgroup_root = root / "sys/fs/cgroup"
    text = _read(root / "proc/self/cgroup") or ""
    limits: list[float] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            limits += [q for d in _cgroup_dirs(cgroup_root, relative) if (q := _v2_quota(d))]
        elif "cpu" in controllers.split(","):
            for mount_name in (controllers, "cpu", "cpu,cpuacct"):
                mount = cgroup_root / mount_name
                if mount.is_dir():
                    limits += [q for d in _cgroup_dirs(mount, relative) if (q := _v1_quota(d))]
                    break
    if not text:  # no /proc/self/cgroup: look at the unified root, then v1
        for quota in (_v2_quota(cgroup_root), _v1_quota(cgroup_root / "cpu")):
            if quota:
                limits.append(quota)
    return min(limits) if limits else None


def cpu_budget(*, root: Path = Path("/"), affinity: set[int] | None = None) -> int:
    """CPUs this process may use: its affinity mask, capped by the cgroup quota (rounded
    down, at least 1; a 1.5-CPU quota is a budget of 1 so threads are never throttled)."""
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            affinity = set(range(os.cpu_count() or 1))
    cpus = max(1, len(affinity))
    quota = cgroup_cpu_limit(root)
    if quota is None:
        return cpus
    return max(1, min(cpus, math.floor(quota)))
