"""What `sr serve` prints on stdout while it starts: one line per replica state change.

Fed by the pool's `replica_state` events until the router is ready (after that the JSON
logs on stderr carry state changes). Repeats of a replica's current state are not printed.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class StartupProgress:
    def __init__(self, out: TextIO | None = None):
        self._out = out or sys.stdout
        self._last: dict[tuple[str, str], str] = {}
        self.done = False

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        if self.done or event != "replica_state":
            return
        deployment = str(fields.get("deployment", "?"))
        replica = str(fields.get("replica", "?"))
        state = str(fields.get("state", "?"))
        if self._last.get((deployment, replica)) == state:
            return
        self._last[(deployment, replica)] = state
        reason = fields.get("reason")
        suffix = f" ({reason})" if reason else ""
        self._print(f"sr: {deployment} replica {replica}: {state}{suffix}")

    def listening(self, url: str) -> None:
        self._print(f"sr: listening on {url} (starting; /ready answers 503 until ready)")

    def ready(self, url: str) -> None:
        self.done = True
        self._print(f"sr: ready, serving on {url}")

    def _print(self, line: str) -> None:
        print(line, file=self._out, flush=True)
