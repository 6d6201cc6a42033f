import torch
import torch.nn.functional as F

from sr.models.gemm_rows import PROBE_ROWS, min_consistent_rows


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
    key = ("cpu", torch.get_num_threads(), 40, 40)
    assert key in gemm_rows._cut_offs
