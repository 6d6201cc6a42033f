"""`sr inventory [--url URL | --config FILE] [--watch] [--interval S] [--api-key K]`.

Reads GET /api/v1/inventory/model-runtime from a running router and prints the replica
table. Which router: `--url`; without it the first listener (host, port) of `--config`
(default ./config.yaml, the file `sr serve` reads), a wildcard host asked on loopback; a
config without `listeners`, or no ./config.yaml at all, means the default listener. A
config that is missing (when named), cannot be read or is invalid is one line on stderr
and exit status 2.

`--watch` redraws in place (clear screen + redraw) until Ctrl-C, which exits 0, and keeps
watching while the router is away (not listening, restarting, answering 5xx): the screen
then says "waiting for URL (why)" until it answers again. Without `--watch`, a router that
cannot be reached is one clear line on stderr and exit status 1; an answer that will not
change by waiting (401, 404, not an inventory) is that in either mode.

The answer is read into the pool's typed views (sr.pool.views), as the router's own table
would be: fields a newer router adds are ignored, and one missing or of another type (a
router of another sr version, or no sr at all) is one line naming the field, exit status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.parse
from pathlib import Path
from typing import NoReturn, TextIO

import httpx

from sr.config.arguments import OneLineArgumentParser, report_usage_error
from sr.config.load import load_config
from sr.config.schema import Listener
from sr.errors import ConfigError, UsageError
from sr.pool.views import Inventory, InventoryShapeError, inventory_from_json
from sr.router.inventory_table import render_inventory
from sr.settings import Settings, read_process_settings

DEFAULT_CONFIG = "config.yaml"
DEFAULT_URL = f"http://{Listener().host}:{Listener().port}"
INVENTORY_PATH = "/api/v1/inventory/model-runtime"
CLEAR_SCREEN = "\x1b[H\x1b[2J"
# Listening on every address: ask on loopback, where this machine's router surely answers.
_LOOPBACK_FOR = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


class InventoryUnavailable(Exception):
    """The router could not be asked, or did not answer with an inventory."""


class RouterAway(InventoryUnavailable):
    """The router is not there or not answering now; waiting may help (`--watch` does)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


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


def _parser(settings: Settings) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="sr inventory", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", type=_router_url, help="router URL (default: the listener of --config)"
    )
    parser.add_argument(
        "--config", help=f"config whose listener to ask (default: ./{DEFAULT_CONFIG})"
    )
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    parser.add_argument(
        "--interval", type=_positive_seconds, default=2.0, help="seconds between redraws"
    )
    parser.add_argument(
        "--api-key", default=settings.inventory_api_key, help="bearer key (or SR_API_KEY)"
    )
    return parser


def router_url(url: str | None, config: str | None) -> str:
    """`url`, else the first listener of the config file; UsageError when it is unusable."""
    if url is not None:
        return url
    path = Path(config or DEFAULT_CONFIG)
    if not path.exists():
        if config is None:
            return DEFAULT_URL  # no config here: sr serve would listen where it always does
        raise UsageError(f"no config at {path}; give --url or the config sr serve reads")
    try:
        listener = load_config(path).listeners[0]  # exactly one (sr.config.validate)
    except ConfigError as error:
        issues = [str(issue) for issue in error.issues] or ["invalid config"]
        if str(path) not in issues[0]:  # name the file once, at the front
            issues[0] = f"{path}: {issues[0]}"
        raise UsageError("; ".join(issues)) from None
    if listener.port == 0:
        raise UsageError(f"{path}: the listener's port is 0 (picked at start); give --url")
    host = _LOOPBACK_FOR.get(listener.host, listener.host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{listener.port}"


def fetch_inventory(client: httpx.Client, url: str, api_key: str | None) -> Inventory:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = url.rstrip("/") + INVENTORY_PATH
    try:
        response = client.get(target, headers=headers)
    except httpx.ConnectError:
        raise RouterAway(
            f"cannot connect to {url} (is `sr serve` running?)", "not listening"
        ) from None
    except httpx.TransportError as error:
        why = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise RouterAway(f"{target}: {why}", why) from None
    if response.status_code >= 500:
        why = f"answered {response.status_code}"
        raise RouterAway(f"{target} {why}", why)
    if response.status_code == 401:
        raise InventoryUnavailable(f"{url} needs an API key (--api-key or SR_API_KEY)")
    if response.status_code != 200:
        raise InventoryUnavailable(f"{target} answered {response.status_code}")
    try:
        data = response.json()
    except ValueError:
        raise InventoryUnavailable(f"{target} did not answer JSON") from None
    try:
        return inventory_from_json(data)
    except InventoryShapeError as error:
        raise InventoryUnavailable(
            f"{target} did not answer an inventory this sr reads: {error}"
        ) from None


def watch(
    client: httpx.Client, url: str, api_key: str | None, interval: float, out: TextIO
) -> NoReturn:
    """Redraw every `interval` seconds until interrupted (KeyboardInterrupt); wait out a
    router that is away; raise InventoryUnavailable for an answer waiting will not fix."""
    colour = out.isatty()
    while True:
        try:
            inventory = fetch_inventory(client, url, api_key)
            text = "\n".join(render_inventory(inventory, colour_states=colour))
        except RouterAway as away:
            text = f"waiting for {url} ({away.why})"
        stamp = time.strftime("%H:%M:%S")
        header = f"{url}  every {interval:g}s  {stamp}  (Ctrl-C to quit)"
        out.write(CLEAR_SCREEN + header + "\n\n" + text + "\n")
        out.flush()
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser(read_process_settings()).parse_args(argv)
        url = router_url(args.url, args.config)
    except UsageError as error:
        return report_usage_error("sr inventory", error)
    try:
        with httpx.Client(timeout=5.0) as client:
            if args.watch:
                watch(client, url, args.api_key, args.interval, sys.stdout)
            inventory = fetch_inventory(client, url, args.api_key)
            print("\n".join(render_inventory(inventory, colour_states=sys.stdout.isatty())))
            return 0
    except InventoryUnavailable as error:
        print(f"sr inventory: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
