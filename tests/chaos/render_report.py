"""Render the rows of $SR_CHAOS_REPORT (written by the chaos suite) as a Markdown table.

SR_CHAOS_REPORT=/tmp/chaos.json python -m pytest -q -m chaos tests/chaos
python tests/chaos/render_report.py /tmp/chaos.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = [
    "sigkill_one_of_two",
    "sigstop_then_sigcont",
    "hung_forwards_ejection",
    "kill_every_worker",
    "overload_3x_cap",
    "sigterm_under_load",
]
COMMON = {"scenario", "sent", "ok", "errors", "lost", "max_latency_ms"}


def render(rows: list[dict]) -> str:
    rank = {name: i for i, name in enumerate(ORDER)}
    rows = sorted(rows, key=lambda r: rank.get(r["scenario"], len(ORDER)))
    lines = [
        "| scenario | sent | ok | errors (code: count) | lost | max latency ms | notes |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for row in rows:
        errors = ", ".join(f"{code}: {n}" for code, n in sorted(row["errors"].items())) or "-"
        notes = ", ".join(f"{k}={row[k]}" for k in sorted(row) if k not in COMMON)
        lines.append(
            f"| {row['scenario']} | {row['sent']} | {row['ok']} | {errors} | {row['lost']} "
            f"| {row['max_latency_ms']} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: render_report.py REPORT.json", file=sys.stderr)
        return 2
    print(render(json.loads(Path(argv[0]).read_text())), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
