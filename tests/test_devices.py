"""GPU inventory (override, discovery, masks) and the CPU budget, on fake filesystems."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from sr.devices import (
    cgroup_cpu_limit,
    cpu_budget,
    gpu_inventory,
    host_id_to_device,
    parse_inventory,
    visible_host_ids,
)
from sr.errors import UsageError


def touch(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---- SR_GPU_INVENTORY ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rocm:0,1", ["rocm:0", "rocm:1"]),
        ("cuda:0,1,2", ["cuda:0", "cuda:1", "cuda:2"]),
        ("cuda:0,cuda:3", ["cuda:0", "cuda:3"]),
        (" rocm:0 , 1 ", ["rocm:0", "rocm:1"]),
        ("", []),
        ("none", []),
    ],
)
def test_inventory_override(spec, expected, tmp_path):
    touch(tmp_path, "dev/nvidia0")  # discovery would find a GPU; the override wins
    assert gpu_inventory({"SR_GPU_INVENTORY": spec}, root=tmp_path) == expected


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("0,1", "expected e.g. rocm:0,1 or cuda:0,1,2 (or empty)"),
        ("gpu:0", "expected e.g. rocm:0,1 or cuda:0,1,2 (or empty)"),
        ("rocm:-1", "expected e.g. rocm:0,1 or cuda:0,1,2 (or empty)"),
        ("rocm:0,cuda:1", "mixes GPU platforms"),
        ("rocm:0,0", "lists rocm:0 twice"),
    ],
)
def test_bad_inventory_override_is_a_usage_error(spec, why):
    with pytest.raises(UsageError) as info:
        parse_inventory(spec)
    assert str(info.value) == f"SR_GPU_INVENTORY={spec!r}: {why}"


# ---- discovery ------------------------------------------------------------------------


def test_no_gpu_nodes_means_no_gpus(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert gpu_inventory({}, root=tmp_path) == []


def test_nvidia_device_nodes(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        touch(tmp_path, f"dev/{name}")
    assert gpu_inventory({}, root=tmp_path) == ["cuda:0", "cuda:1"]


def test_nvidia_proc_entries_take_precedence(tmp_path):
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (tmp_path / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
    touch(tmp_path, "dev/nvidia0")
    assert gpu_inventory({}, root=tmp_path) == ["cuda:0", "cuda:1", "cuda:2"]


def test_cuda_mask_limits_discovered_gpus(tmp_path):
    for i in range(4):
        touch(tmp_path, f"dev/nvidia{i}")
    assert gpu_inventory({"CUDA_VISIBLE_DEVICES": "3,1"}, root=tmp_path) == ["cuda:0", "cuda:1"]
    assert gpu_inventory({"CUDA_VISIBLE_DEVICES": "3,9"}, root=tmp_path) == ["cuda:0"]
    assert gpu_inventory({"CUDA_VISIBLE_DEVICES": ""}, root=tmp_path) == []
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert gpu_inventory(uuids, root=tmp_path) == ["cuda:0", "cuda:1"]


def test_amd_kfd_topology_counts_gpu_nodes_only(tmp_path):
    touch(tmp_path, "sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n")  # the CPU
    touch(tmp_path, "sys/class/kfd/kfd/topology/nodes/1/gpu_id", "53896\n")
    touch(tmp_path, "sys/class/kfd/kfd/topology/nodes/2/gpu_id", "12345\n")
    assert gpu_inventory({}, root=tmp_path) == ["rocm:0", "rocm:1"]
    assert gpu_inventory({"ROCR_VISIBLE_DEVICES": "1"}, root=tmp_path) == ["rocm:0"]


def test_amd_render_nodes_with_kfd(tmp_path):
    touch(tmp_path, "dev/kfd")
    touch(tmp_path, "dev/dri/renderD128")
    touch(tmp_path, "dev/dri/renderD129")
    touch(tmp_path, "dev/dri/card0")
    assert gpu_inventory({}, root=tmp_path) == ["rocm:0", "rocm:1"]


def test_render_nodes_without_kfd_are_not_amd_gpus(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    touch(tmp_path, "dev/dri/renderD128")  # e.g. an integrated Intel GPU
    assert gpu_inventory({}, root=tmp_path) == []


def test_torch_is_asked_only_when_already_imported(tmp_path, monkeypatch):
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(device_count=lambda: 2),
        version=types.SimpleNamespace(hip="6.1"),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert gpu_inventory({}, root=tmp_path) == ["rocm:0", "rocm:1"]
    fake.version.hip = None
    assert gpu_inventory({}, root=tmp_path) == ["cuda:0", "cuda:1"]

    def broken():
        raise RuntimeError("driver too old")

    fake.cuda.device_count = broken
    assert gpu_inventory({}, root=tmp_path) == []


# ---- masks ----------------------------------------------------------------------------


def test_rocm_masks_compose_rocr_then_hip():
    env = {"ROCR_VISIBLE_DEVICES": "7,3,5", "HIP_VISIBLE_DEVICES": "2,0"}
    assert visible_host_ids("rocm", env) == [5, 7]
    assert host_id_to_device(5, "rocm", env) == "rocm:0"
    assert host_id_to_device(7, "rocm", env) == "rocm:1"


def test_hip_honours_cuda_visible_devices_when_hip_mask_is_unset():
    env = {"CUDA_VISIBLE_DEVICES": "3,1"}
    assert visible_host_ids("rocm", env) == [3, 1]
    assert host_id_to_device(1, "rocm", env) == "rocm:1"
    env["HIP_VISIBLE_DEVICES"] = "1"
    assert visible_host_ids("rocm", env) == [1]


def test_rocm_masks_do_not_apply_to_cuda():
    assert visible_host_ids("cuda", {"ROCR_VISIBLE_DEVICES": "1"}) is None
    assert host_id_to_device(4, "cuda", {"ROCR_VISIBLE_DEVICES": "1"}) == "cuda:4"


def test_uuid_masks_cannot_map_host_ids():
    with pytest.raises(UsageError) as info:
        host_id_to_device(0, "cuda", {"CUDA_VISIBLE_DEVICES": "GPU-1234"})
    assert str(info.value) == (
        "cannot map --device-ids through CUDA_VISIBLE_DEVICES='GPU-1234':"
        " only comma-separated integer indices are supported"
    )


# ---- CPU budget -----------------------------------------------------------------------


def test_budget_is_the_affinity_without_quota(tmp_path):
    assert cpu_budget(root=tmp_path, affinity={0, 1, 2, 5}) == 4


def test_cgroup_v2_quota_caps_the_budget(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1\n")
    touch(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.5
    assert cpu_budget(root=tmp_path, affinity=set(range(8))) == 2
    assert cpu_budget(root=tmp_path, affinity={0}) == 1


def test_cgroup_v2_ancestor_limit_applies(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/a/b\n")
    touch(tmp_path, "sys/fs/cgroup/a/b/cpu.max", "max 100000\n")
    touch(tmp_path, "sys/fs/cgroup/a/cpu.max", "300000 100000\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(16))) == 3


def test_cgroup_v2_namespace_reads_the_mount_root(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/\n")
    touch(tmp_path, "sys/fs/cgroup/cpu.max", "100000 100000\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(4))) == 1
    touch(tmp_path, "proc/self/cgroup", "0::/host/path/not/mounted\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(4))) == 1


def test_cgroup_v2_unlimited(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/\n")
    touch(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    assert cpu_budget(root=tmp_path, affinity=set(range(6))) == 6


def test_fractional_quota_below_one_cpu_still_gives_one(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/\n")
    touch(tmp_path, "sys/fs/cgroup/cpu.max", "50000 100000\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(6))) == 1


def test_cgroup_v1_quota(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    touch(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n")
    touch(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) == 4.0
    assert cpu_budget(root=tmp_path, affinity=set(range(32))) == 4


def test_cgroup_v1_unlimited_and_separate_cpu_mount(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "2:cpuacct:/\n1:cpu:/\n")
    touch(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
    touch(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    touch(tmp_path, "sys/fs/cgroup/cpu/cpu.cfs_quota_us", "150000\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(8))) == 1


def test_garbage_cgroup_files_are_ignored(tmp_path):
    touch(tmp_path, "proc/self/cgroup", "0::/\n")
    touch(tmp_path, "sys/fs/cgroup/cpu.max", "lots\n")
    assert cpu_budget(root=tmp_path, affinity={0, 1}) == 2


def test_without_proc_cgroup_the_unified_root_is_read(tmp_path):
    touch(tmp_path, "sys/fs/cgroup/cpu.max", "200000 100000\n")
    assert cpu_budget(root=tmp_path, affinity=set(range(8))) == 2


def test_real_host_budget_is_positive():
    assert cpu_budget() >= 1
