"""Prometheus text in tests: samples read with prometheus_client's own parser, and
`promtool check metrics` (Prometheus' linter) where it is installed (Debian: `apt-get
install prometheus`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def samples(text: str) -> dict[tuple[str, Labels], float]:
    """(sample name, sorted labels) -> value, for every sample of the text."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def named(found: dict[tuple[str, Labels], float], name: str) -> dict[Labels, float]:
    """The samples called `name`, by their labels."""
    return {labels: value for (sample, labels), value in found.items() if sample == name}


def families(text: str) -> dict[str, str]:
    """Family name -> type."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}


# For async tests: a skip raised inside a Trio test loses its reason in pytest's summary, so
# they are marked instead, and skip before they run.
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not installed (Debian: apt-get install prometheus)",
)


def promtool_check(text: str) -> None:
    """Fail on anything `promtool check metrics` reports; skip where it is not installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    report = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0 and not report.strip(), report
