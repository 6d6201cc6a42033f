"""An ArgumentParser whose errors are one line and exit status 2, via `UsageError`."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from sr.errors import UsageError


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse prints usage plus the error and exits itself; sr raises instead, so the
    caller prints a single `<prog>: error: ...` line and nothing half-done follows."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def bounded_int(low: int, high: int | None = None):
    """An argparse `type` for an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            upper = f"..{high}" if high is not None else " or more"
            raise argparse.ArgumentTypeError(f"must be {low}{upper}, got {value}")
        return value

    return parse


def report_usage_error(prog: str, exc: UsageError) -> int:
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 2
