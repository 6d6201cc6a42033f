import pytest


@pytest.fixture
def measured_keys(monkeypatch) -> list[tuple]:
    """Every cut-off sr.models.gemm_rows measures from here on, as (in, out, kernel,
    dtype), with none known yet (as in a new process)."""
    from sr.models import gemm_rows

    measured: list[tuple] = []
    real_measure = gemm_rows._measure

    def measure(device, *key):
        measured.append(key)
        return real_measure(device, *key)

    monkeypatch.setattr(gemm_rows, "_measure", measure)
    monkeypatch.setattr(gemm_rows, "_cut_offs", {})
    return measured
