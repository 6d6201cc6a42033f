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
