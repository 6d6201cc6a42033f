"""`sr inventory [--url URL] [--watch] [--interval S] [--api-key K]`: the replica table.

Reads GET /api/v1/inventory/model-runtime from a running router. `--watch` redraws in
place (clear screen + redraw) until Ctrl-C, which exits 0. A router that cannot be reached
is one clear line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import urllib.parse
from typing import Any

import httpx

from sr.config.arguments import OneLineArgumentParser, report_usage_error
from sr.errors import UsageError
from sr.router.inventory_table import render_inventory

DEFAULT_URL = "http://127.0.0.1:8899"
INVENTORY_PATH = "/api/v1/inventory/model-runtime"
CLEAR_SCREEN = "\x1b[H\x1b[2J"


class InventoryUnavailable(Exception):
    """The router could not be asked, or did not answer with an inventory."""


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _router_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT, got {text!r}")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="sr inventory", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", type=_router_url, default=DEFAULT_URL, help=f"router URL (default {DEFAULT_URL})"
    )
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    parser.add_argument(
        "--interval", type=_positive_seconds, default=2.0, help="seconds between redraws"
    )
    parser.add_argument(
        "--api-key", default=os.environ.get("SR_API_KEY"), help="bearer key (or SR_API_KEY)"
    )
    return parser


def fetch_inventory(client: httpx.Client, url: str, api_key: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = url.rstrip("/") + INVENTORY_PATH
    try:
        response = client.get(target, headers=headers)
    except httpx.ConnectError:
        raise InventoryUnavailable(f"cannot connect to {url} (is `sr serve` running?)") from None
    except httpx.HTTPError as error:
        raise InventoryUnavailable(f"{target}: {type(error).__name__}: {error}") from None
    if response.status_code == 401:
        raise InventoryUnavailable(f"{url} needs an API key (--api-key or SR_API_KEY)")
    if response.status_code != 200:
        raise InventoryUnavailable(f"{target} answered {response.status_code}")
    try:
        inventory = response.json()
    except ValueError:
        raise InventoryUnavailable(f"{target} did not answer JSON") from None
    if not isinstance(inventory, dict):
        raise InventoryUnavailable(f"{target} did not answer an inventory object")
    return inventory


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as error:
        return report_usage_error("sr inventory", error)
    colour = sys.stdout.isatty()
    try:
        with httpx.Client(timeout=5.0) as client:
            while True:
                inventory = fetch_inventory(client, args.url, args.api_key)
                text = "\n".join(render_inventory(inventory, colour_states=colour))
                if args.watch:
                    stamp = time.strftime("%H:%M:%S")
                    header = f"{args.url}  every {args.interval:g}s  {stamp}  (Ctrl-C to quit)"
                    sys.stdout.write(CLEAR_SCREEN + header + "\n\n" + text + "\n")
                    sys.stdout.flush()
                    time.sleep(args.interval)
                else:
                    print(text)
                    return 0
    except InventoryUnavailable as error:
        print(f"sr inventory: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
