"""API keys on `sr worker`: a worker that other hosts can reach answers only its router.

Rules:
* a worker listening on TCP at a non-loopback address (anything but 127.0.0.0/8, ::1 and
  `localhost`: `0.0.0.0`, `::`, an interface address, a host name) requires a key, from
  `--api-key` or the environment variable SR_WORKER_API_KEY; without one it refuses to
  start (one line, exit status 2: `required_key_problem`);
* SR_WORKER_API_KEY is read only for TCP listeners: managed workers (a Unix socket in the
  router's private folder) inherit the router's environment, which may hold that variable
  for attached workers, and their router sends them no key. `--api-key` with `--uds` is
  explicit, and enforced;
* with a key, every route except `/health` and `/health/live` needs
  `Authorization: Bearer <key>`, compared in constant time (`hmac.compare_digest`);
  otherwise 401 `invalid_api_key` with the standard error body. The two open routes say
  only whether the worker is up: an orchestrator probes them without credentials
  (a Kubernetes probe cannot carry a secret header);
* the key is never logged or echoed. It travels in clear text unless TLS terminates in
  front of the worker (docs/security.md).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from sr.answer import Answer
from sr.errors import InvalidApiKey, UsageError

ENV_VAR = "SR_WORKER_API_KEY"
OPEN_PATHS = frozenset({"/health", "/health/live"})


def is_loopback_host(host: str) -> bool:
    """True when binding `host` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name (or "" = every address): it may resolve anywhere


def worker_key(flag: str | None, environ: Mapping[str, str], *, tcp: bool) -> str | None:
    """The key a worker enforces: `--api-key`, else SR_WORKER_API_KEY (TCP only)."""
    if flag is not None:
        key = flag.strip()
        if not key:
            raise UsageError("--api-key: must not be empty")
    elif tcp:
        key = environ.get(ENV_VAR, "").strip()
        if not key:
            return None
    else:
        return None
    if not key.isascii() or not key.isprintable() or " " in key:
        source = "--api-key" if flag is not None else ENV_VAR
        raise UsageError(f"{source}: must be printable ASCII without spaces (an HTTP header)")
    return key


def required_key_problem(host: str, key: str | None) -> str | None:
    """Why a worker bound to `host` may not start without a key, or None."""
    if key is not None or is_loopback_host(host):
        return None
    shown = host or "every address"
    return (
        f"--host {shown} is reachable from other machines: give an API key"
        f" (--api-key KEY or the environment variable {ENV_VAR}); the router sends it"
        " (api_key_env in its config)"
    )


class WorkerKeyCheck:
    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def allows(self, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        if path in OPEN_PATHS:
            return True
        for name, value in headers:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # compare_digest on every bearer value: no early answer on a near miss
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False


def unauthorized() -> Answer:
    return InvalidApiKey(
        "missing or invalid API key (Authorization: Bearer <key>)",
        headers={"WWW-Authenticate": "Bearer"},
    ).answer()
