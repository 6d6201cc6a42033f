"""The reliability table renderer (no processes)."""

from __future__ import annotations

from tests.chaos.render_report import render


def test_rows_in_scenario_order_with_errors_and_notes():
    rows = [
        {"scenario": "overload_3x_cap", "sent": 96, "ok": 32, "errors": {"overloaded": 64},
         "lost": 0, "max_latency_ms": 2710, "slow_ms": 2500},
        {"scenario": "sigkill_one_of_two", "sent": 160, "ok": 160, "errors": {}, "lost": 0,
         "max_latency_ms": 90},
    ]  # fmt: skip
    table = render(rows).splitlines()
    assert table[2] == "| sigkill_one_of_two | 160 | 160 | - | 0 | 90 |  |"
    assert table[3] == "| overload_3x_cap | 96 | 32 | overloaded: 64 | 0 | 2710 | slow_ms=2500 |"
