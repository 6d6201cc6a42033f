"""The kernel probe's answer kept on disk (sr.models.probe_cache), and the model's fork
server taking it instead of probing (sr.worker.model_server)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sr.models import probe_cache
from sr.settings import host_cache_dir, native_library_variables
from sr.worker import model_server

CPU = torch.device("cpu")
CHOICE = {"linear": "onednn", "reason": "rows consistent from 2 row(s) on"}


def test_a_kept_choice_is_found_under_its_key_only(tmp_path):
    path = tmp_path / "sr" / probe_cache.FILE_NAME
    key = probe_cache.probe_key(CPU, torch.float32, 1, {})
    assert probe_cache.load(path, key) is None  # no file yet
    probe_cache.store(path, key, CHOICE)
    assert probe_cache.load(path, key) == CHOICE
    for other in (
        probe_cache.probe_key(CPU, torch.float32, 2, {}),
        probe_cache.probe_key(CPU, torch.bfloat16, 1, {}),
        probe_cache.probe_key(CPU, torch.float32, 1, {"ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}),
    ):
        assert other != key and probe_cache.load(path, other) is None
    assert [p.name for p in path.parent.iterdir()] == [probe_cache.FILE_NAME]  # no temp left


def test_a_damaged_file_costs_a_probe_and_is_replaced(tmp_path):
    path = tmp_path / probe_cache.FILE_NAME
    key = probe_cache.probe_key(CPU, torch.float32, 1, {})
    for damaged in ("{not json", "[1, 2]", json.dumps({key: {"linear": 3}})):
        path.write_text(damaged)
        assert probe_cache.load(path, key) is None
    probe_cache.store(path, key, CHOICE)
    assert probe_cache.load(path, key) == CHOICE


def test_the_environment_names_the_folder_or_turns_it_off(tmp_path):
    assert host_cache_dir({"SR_CACHE_DIR": "off", "HOME": "/h"}) is None
    assert probe_cache.cache_file(None) is None
    assert host_cache_dir({"SR_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert host_cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/sr")
    assert host_cache_dir({"HOME": "/h"}) == Path("/h/.cache/sr")
    assert probe_cache.cache_file(tmp_path) == tmp_path / "kernel-probe.json"
    probe_cache.store(None, "k", CHOICE)  # off: nothing written, nothing raised
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    probe_cache.store(not_a_folder / "sub" / "kernel-probe.json", "k", CHOICE)  # ignored


def test_only_the_variables_torchs_libraries_read_are_part_of_the_key():
    env = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2", "PATH": "/b"}
    assert native_library_variables(env) == {
        "OMP_NUM_THREADS": "1", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
    }  # fmt: skip


def test_the_model_server_probes_once_and_then_takes_the_kept_choice(tmp_path, monkeypatch):
    """A host's first start loads on oneDNN while the probe's child runs; its answer is
    kept, and a later start takes it without a child."""
    monkeypatch.setenv("SR_CACHE_DIR", str(tmp_path))
    probes = []

    class Probe:
        def __init__(self, device, dtype, threads):
            probes.append((device, dtype, threads))

        def wait(self):
            return model_server.linear.KernelChoice("blas", "probed")

    monkeypatch.setattr(model_server._ProbeChild, "start", Probe)
    first = model_server._HostChoice.start(CPU, torch.float32, 2)
    assert first.guess.linear == "onednn"  # this torch build has oneDNN
    assert first.finish() == model_server.linear.KernelChoice("blas", "probed")
    again = model_server._HostChoice.start(CPU, torch.float32, 2)
    kept = model_server.linear.KernelChoice("blas", "probed (probed at an earlier start)")
    assert again.guess == kept and again.finish() == kept
    other_count = model_server._HostChoice.start(CPU, torch.float32, 1)
    assert other_count.finish().reason == "probed"
    assert probes == [(CPU, torch.float32, 2), (CPU, torch.float32, 1)]


def test_a_dtype_onednn_cannot_serve_is_blas_without_a_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("SR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_server._ProbeChild, "start", None)  # a call would fail
    choice = model_server._HostChoice.start(CPU, torch.float16, 2)
    assert choice.finish().linear == "blas"
    assert choice.finish().reason == "float16 is served by BLAS"


def test_cut_offs_are_kept_per_key_and_shape_and_kernel(tmp_path):
    path = probe_cache.cut_off_file(tmp_path)
    one = probe_cache.probe_key(CPU, torch.float32, 1, {})
    two = probe_cache.probe_key(CPU, torch.float32, 2, {})
    assert probe_cache.load_cut_offs(path, one) == {}  # no file yet
    probe_cache.store_cut_offs(path, {
        probe_cache.cut_off_key(one, 384, 1152, "onednn"): 2,
        probe_cache.cut_off_key(one, 1536, 384, "blas"): 4,
        probe_cache.cut_off_key(two, 384, 1152, "onednn"): 12,
    })  # fmt: skip
    kept = {(384, 1152, "onednn"): 2, (1536, 384, "blas"): 4}
    assert probe_cache.load_cut_offs(path, one) == kept
    assert probe_cache.load_cut_offs(path, two) == {(384, 1152, "onednn"): 12}
    path.write_text(json.dumps({probe_cache.cut_off_key(one, 8, 8, "blas"): "2", "x": 1}))
    assert probe_cache.load_cut_offs(path, one) == {}  # damaged entries are not kept ones
    probe_cache.store_cut_offs(None, {"k": 1})  # the cache off: nothing written, nothing raised


def test_the_model_server_measures_cut_offs_once_per_host(tmp_path, monkeypatch, tiny_model_dir):
    """A later start takes the kept cut-offs, the same ones, and measures nothing."""
    from sr.models import gemm_rows, load_model

    monkeypatch.setenv("SR_CACHE_DIR", str(tmp_path))
    measures = []
    real_measure = gemm_rows._measure

    def measure(*args):
        measures.append(args)
        return real_measure(*args)

    monkeypatch.setattr(gemm_rows, "_measure", measure)
    monkeypatch.setattr(gemm_rows, "_cut_offs", {})
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model_server._calibrate(load_model(tiny_model_dir), CPU, {torch.float32})
        first = gemm_rows.measured_at(CPU, 1)
        assert measures and first
        measures.clear()
        monkeypatch.setattr(gemm_rows, "_cut_offs", {})  # a new process
        model = load_model(tiny_model_dir)
        model_server._calibrate(model, CPU, {torch.float32})
        assert measures == []
        assert gemm_rows.measured_at(CPU, 1) == first
        assert model.calibrate_threads() == max(2, *first.values())
    finally:
        torch.set_num_threads(before)


def test_a_models_product_keys_are_what_its_calibration_measures(measured_keys, tiny_model_dir):
    """The keys measured side by side ahead of calibration are exactly the shapes the
    calibration then asks for, so it measures nothing itself."""
    from sr.models import load_model

    measured = measured_keys
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_model(tiny_model_dir)
        model.calibrate_threads()
        assert measured and set(measured) == model.product_keys()
    finally:
        torch.set_num_threads(before)
