import pytest
import torch
import torch.nn.functional as F

from sr.models import kernels
from sr.models.gemm_rows import PROBE_ROWS, min_consistent_rows, threads_agree


def test_rows_past_the_cut_off_match_a_longer_product():
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cut_off = min_consistent_rows(torch.device("cpu"), 48, 48)
            assert 1 <= cut_off < PROBE_ROWS
            generator = torch.Generator().manual_seed(9)
            x = torch.randn(100, 48, generator=generator)
            w = torch.randn(48, 48, generator=generator)
            full = F.linear(x, w)
            for rows in range(cut_off, 80, 7):
                assert torch.equal(F.linear(x[:rows], w), full[:rows]), (threads, rows)
    finally:
        torch.set_num_threads(before)


def test_cut_off_is_cached_per_thread_count():
    from sr.models import gemm_rows

    min_consistent_rows(torch.device("cpu"), 40, 40)
    key = ("cpu", torch.get_num_threads(), 40, 40, kernels.BLAS, torch.float32)
    assert key in gemm_rows._cut_offs


@pytest.mark.skipif(
    kernels.onednn_unavailable(torch.device("cpu"), torch.float32) is not None,
    reason="no oneDNN for float32 here",
)
def test_packed_kernel_rows_past_its_cut_off_match_anywhere_in_a_longer_product():
    """The probe's claim for oneDNN, checked on other data, rows and offsets than its own."""
    cpu = torch.device("cpu")
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(300, 384, generator=generator)
    w = torch.randn(1536, 384, generator=generator)
    b = torch.randn(1536, generator=generator)
    packed = kernels.prepare(kernels.ONEDNN, w)

    def product(rows):
        return kernels.linear(kernels.ONEDNN, rows, packed, b)

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cut_off = min_consistent_rows(cpu, 384, 1536, kernels.ONEDNN)
            assert 1 <= cut_off < PROBE_ROWS
            full = product(x)
            for start, rows in ((0, cut_off), (7, cut_off + 3), (150, 40), (299 - 64, 64)):
                got = product(x[start : start + rows])
                assert torch.equal(got, full[start : start + rows]), (threads, start, rows)
            assert threads_agree(cpu, 384, 1536, kernels.ONEDNN)
    finally:
        torch.set_num_threads(before)


def test_measure_many_finds_what_one_at_a_time_finds(monkeypatch, measured_keys):
    """Side by side on helper threads, each shape measured once, with the cut-off it has
    when measured alone; the helper threads are gone afterwards."""
    import os

    from sr.models import gemm_rows

    cpu = torch.device("cpu")
    keys = [(48, 48, kernels.BLAS, torch.float32), (48, 96, kernels.BLAS, torch.float32),
            (96, 48, kernels.BLAS, torch.float32)]  # fmt: skip
    if kernels.onednn_unavailable(cpu, torch.float32) is None:
        keys.append((384, 384, kernels.ONEDNN, torch.float32))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = {key: min_consistent_rows(cpu, *key) for key in keys}
        monkeypatch.setattr(gemm_rows, "_cut_offs", {})
        measured = measured_keys
        measured.clear()
        threads = len(os.listdir("/proc/self/task"))
        gemm_rows.measure_many(cpu, keys + keys[:1], workers=2)
        assert len(os.listdir("/proc/self/task")) == threads  # no OpenMP team left behind
        assert sorted(measured, key=str) == sorted(keys, key=str)
        assert gemm_rows.measured_at(cpu, 1) == alone
        gemm_rows.measure_many(cpu, keys, workers=2)  # all known: nothing measured again
        assert len(measured) == len(keys)
    finally:
        torch.set_num_threads(before)


def test_measure_many_refuses_a_process_above_one_thread():
    from sr.models import gemm_rows

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="1 thread"):
            gemm_rows.measure_many(torch.device("cpu"), [], workers=2)
    finally:
        torch.set_num_threads(before)
