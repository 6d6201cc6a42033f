"""Where `sr serve` places a deployment's workers (-dp, --device-ids, the visible-device
mask), as pure functions."""

from __future__ import annotations

import pytest

from sr.config.placement import ServeFlags, apply_flags, cycle, parse_device_ids, place
from sr.config.schema import Deployment, Replica, SrConfig, default_config
from sr.errors import UsageError


def devices(replicas: list[Replica]) -> list[str]:
    return [r.device for r in replicas]


def config_with(**deployment) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(artifact=deployment.pop("artifact", "a"), **deployment)
    return cfg


def apply(cfg, inventory=(), env=None, **flags) -> SrConfig:
    return apply_flags(cfg, ServeFlags(**flags), list(inventory), env or {})


def primary_devices(cfg: SrConfig) -> list[str]:
    return devices(cfg.deployments["primary"].placements())


# ---- worked examples: masks, authored placements, short GPUs, a shared GPU -----------


def test_spec_mask_7_3_maps_ids_3_7_to_rocm_1_rocm_0():
    cfg = apply(
        default_config(),
        inventory=["rocm:0", "rocm:1"],
        env={"ROCR_VISIBLE_DEVICES": "7,3"},
        device_ids="3,7",
    )
    assert primary_devices(cfg) == ["rocm:1", "rocm:0"]


def test_spec_authored_placements_cycle_in_declared_order():
    authored = config_with(replicas=[Replica(device="rocm:0"), Replica(device="rocm:1")])
    assert primary_devices(apply(authored, data_parallel=3)) == ["rocm:0", "rocm:1", "rocm:0"]
    assert primary_devices(apply(authored, data_parallel=1)) == ["rocm:0"]


def test_spec_new_gpu_placement_refuses_when_gpus_are_short():
    with pytest.raises(UsageError) as info:
        apply(default_config(), inventory=["rocm:0"], data_parallel=4)
    assert str(info.value) == (
        "-dp 4 requires 4 available GPUs; use --device-ids to share a GPU (found 1: rocm:0)"
    )


def test_spec_one_id_with_dp_2_puts_two_workers_on_it():
    cfg = apply(default_config(), inventory=["rocm:0"], device_ids="0", data_parallel=2)
    assert primary_devices(cfg) == ["rocm:0", "rocm:0"]


# ---- -dp ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 65, -1])
def test_dp_range(n):
    with pytest.raises(UsageError, match=rf"^-dp must be between 1 and 64, got {n}$"):
        apply(default_config(), data_parallel=n)


def test_dp_on_a_cpu_host_makes_cpu_workers():
    assert primary_devices(apply(default_config(), data_parallel=3)) == ["cpu"] * 3
    assert primary_devices(apply(default_config(), data_parallel=64)) == ["cpu"] * 64


def test_new_gpu_placement_takes_the_first_n_gpus():
    cfg = apply(default_config(), inventory=["cuda:0", "cuda:1", "cuda:2"], data_parallel=2)
    assert primary_devices(cfg) == ["cuda:0", "cuda:1"]


def test_platform_switch_without_dp_keeps_the_worker_count():
    cpu2 = config_with(replicas=[Replica(device="cpu"), Replica(device="cpu")])
    cfg = apply(cpu2, inventory=["rocm:0", "rocm:1"], platform="rocm")
    assert primary_devices(cfg) == ["rocm:0", "rocm:1"]
    with pytest.raises(UsageError) as info:
        apply(cpu2, inventory=["rocm:0"], platform="rocm")
    assert str(info.value) == (
        "placing 2 workers on rocm requires 2 available GPUs; use -dp to change the count"
        " or --device-ids to share a GPU (found 1: rocm:0)"
    )


def test_explicit_cpu_platform_moves_gpu_workers_to_cpu():
    authored = config_with(replicas=[Replica(device="cuda:0"), Replica(device="cuda:1")])
    assert primary_devices(apply(authored, platform="cpu")) == ["cpu", "cpu"]
    assert primary_devices(apply(authored, platform="cpu", data_parallel=1)) == ["cpu"]


def test_explicit_platform_without_matching_gpus_is_refused():
    with pytest.raises(UsageError, match=r"found 0: none"):
        apply(default_config(), inventory=["rocm:0"], platform="cuda", data_parallel=1)


def test_auto_keeps_authored_gpu_placements_even_without_local_gpus():
    authored = config_with(replicas=[Replica(device="cuda:3")])
    assert primary_devices(apply(authored, data_parallel=2)) == ["cuda:3", "cuda:3"]


def test_auto_uses_the_gpu_inventory_for_a_cpu_deployment():
    cfg = apply(default_config(), inventory=["rocm:0", "rocm:1"], data_parallel=2)
    assert primary_devices(cfg) == ["rocm:0", "rocm:1"]


def test_cycle_copies_replicas():
    original = [Replica(device="cpu")]
    resized = cycle(original, 2)
    resized[0].device = "cuda:0"
    assert original == [Replica(device="cpu")]


# ---- --device-ids -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "a", "0,", "-1", "1.5", "0;1", " , "])
def test_device_ids_must_be_non_negative_integers(text):
    with pytest.raises(UsageError) as info:
        parse_device_ids(text)
    assert str(info.value) == (
        f"--device-ids must be comma-separated non-negative integers, got {text!r}"
    )


def test_device_ids_parse_with_spaces():
    assert parse_device_ids("0, 2 ,10") == [0, 2, 10]


def test_duplicate_device_id_points_to_dp():
    with pytest.raises(UsageError) as info:
        parse_device_ids("0,1,0")
    assert str(info.value) == (
        "--device-ids lists 0 more than once; use -dp to repeat workers on one GPU"
        " (e.g. -dp 2 --device-ids 0)"
    )


def test_ids_one_each_without_dp():
    cfg = apply(default_config(), inventory=["cuda:0", "cuda:1", "cuda:2"], device_ids="2,0")
    assert primary_devices(cfg) == ["cuda:2", "cuda:0"]


def test_ids_n_with_dp_n():
    cfg = apply(default_config(), inventory=["cuda:0", "cuda:1"], device_ids="1,0", data_parallel=2)
    assert primary_devices(cfg) == ["cuda:1", "cuda:0"]


def test_ids_count_must_be_one_or_n():
    with pytest.raises(UsageError) as info:
        apply(default_config(), inventory=["rocm:0", "rocm:1"], device_ids="0,1", data_parallel=3)
    assert str(info.value) == (
        "-dp 3 with 2 device IDs: give one ID (all 3 workers on that GPU) or 3 IDs"
        " (one worker each)"
    )


def test_ids_require_a_gpu_platform():
    expected = (
        "--device-ids requires a GPU platform: no GPU found on this host (platform cpu);"
        " pass --platform cuda|rocm or set SR_GPU_INVENTORY"
    )
    with pytest.raises(UsageError) as info:
        apply(default_config(), device_ids="0")
    assert str(info.value) == expected
    with pytest.raises(UsageError, match=r"platform cpu"):
        apply(default_config(), inventory=["cuda:0"], platform="cpu", device_ids="0")


def test_id_outside_the_mask_is_an_error():
    with pytest.raises(UsageError) as info:
        apply(
            default_config(),
            inventory=["rocm:0", "rocm:1"],
            env={"ROCR_VISIBLE_DEVICES": "7,3"},
            device_ids="4",
        )
    assert str(info.value) == (
        "--device-ids 4: host GPU 4 is not visible under ROCR_VISIBLE_DEVICES=7,3"
        " (visible host GPUs: 7, 3)"
    )


def test_id_without_mask_must_be_in_the_inventory():
    with pytest.raises(UsageError) as info:
        apply(default_config(), inventory=["cuda:0"], device_ids="1")
    assert str(info.value) == (
        "--device-ids 1 maps to cuda:1, which is not an available GPU (inventory: cuda:0);"
        " set SR_GPU_INVENTORY when planning for another host"
    )


def test_cuda_mask_maps_ids():
    cfg = apply(
        default_config(),
        inventory=["cuda:0", "cuda:1", "cuda:2"],
        env={"CUDA_VISIBLE_DEVICES": "4,5,6"},
        device_ids="6",
    )
    assert primary_devices(cfg) == ["cuda:2"]


# ---- MODEL, -e and what flags leave alone -------------------------------------------


def test_model_only_keeps_replicas_engine_args_and_profile_and_drops_the_pin():
    cfg = config_with(
        artifact="old/model",
        revision="abc",
        profile="throughput",
        max_num_seqs=8,
        replicas=[Replica(device="cpu"), Replica(device="cpu")],
    )
    new = apply(cfg, model="new/model")
    dep = new.deployments["primary"]
    assert (dep.artifact, dep.revision) == ("new/model", None)
    assert (dep.profile, dep.max_num_seqs) == ("throughput", 8)
    assert devices(dep.replicas) == ["cpu", "cpu"]
    assert cfg.deployments["primary"].artifact == "old/model"  # input untouched


def test_same_model_keeps_the_pin():
    cfg = config_with(artifact="m", revision="abc")
    assert apply(cfg, model="m") == cfg


def test_model_targets_the_decision_model_deployment():
    cfg = config_with()
    cfg.deployments["other"] = Deployment(artifact="b")
    cfg.global_.model_catalog.system.decision_model.deployment = "other"
    new = apply(cfg, model="c", data_parallel=2)
    assert new.deployments["primary"] == cfg.deployments["primary"]
    assert new.deployments["other"].artifact == "c"
    assert devices(new.deployments["other"].replicas) == ["cpu", "cpu"]


def test_engine_flag_disables_the_router():
    cfg = apply(default_config(), engine=True)
    assert cfg.global_.router.enabled is False
    assert cfg.deployments == default_config().deployments


def test_no_flags_change_nothing():
    cfg = config_with(device="cuda:0")
    assert apply(cfg) == cfg


def test_placement_flags_write_explicit_replicas():
    cfg = apply(config_with(device="cpu"), data_parallel=2)
    dep = cfg.deployments["primary"]
    assert dep.device is None and devices(dep.replicas) == ["cpu", "cpu"]


@pytest.mark.parametrize(
    "flags",
    [{"data_parallel": 2}, {"device_ids": "0"}, {"platform": "cpu"}],
)
def test_attached_deployments_refuse_flag_resizing(flags):
    attached = config_with(endpoint="http://h:1", model="a")
    with pytest.raises(UsageError) as info:
        apply(attached, inventory=["cuda:0"], **flags)
    assert str(info.value) == (
        "deployment 'primary' has attached replicas (endpoint); -dp/--device-ids/--platform"
        " cannot change it: edit the config"
    )


def test_attached_deployments_refuse_model():
    attached = config_with(
        replicas=[Replica(device="cpu"), Replica(endpoint="http://h:1", model="a")]
    )
    with pytest.raises(UsageError, match=r"MODEL cannot change it: edit the config"):
        apply(attached, model="b")


def test_missing_default_deployment():
    cfg = config_with()
    cfg.global_.model_catalog.system.decision_model.deployment = "gone"
    with pytest.raises(UsageError, match=r"^the default deployment 'gone' .* is not in the"):
        apply(cfg, data_parallel=2)


def test_place_is_pure_over_its_inputs():
    current = [Replica(device="rocm:0")]
    assert devices(place(ServeFlags(data_parallel=2), current, [], {})) == ["rocm:0"] * 2
    assert current == [Replica(device="rocm:0")]
