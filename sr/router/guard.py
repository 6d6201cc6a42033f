"""The front door's rules against being driven by web pages: Host, Origin and body type.

sr's default listener is loopback with no API keys: any program on the host may call it,
which is the point. A web page the operator visits must not: a browser lets any page send
"simple" cross-origin requests (text/plain or form bodies, no preflight) and, through DNS
rebinding, even read answers, with `Host` set to the attacker's name. So, as local
development servers do:

- **Host.** A loopback listener answers only loopback names (`localhost`, `*.localhost`,
  127.0.0.0/8, `[::1]`, any port) plus the listener's `allowed_hosts`; another listener
  answers any name unless `allowed_hosts` lists some ("*": any). A request without `Host`
  (HTTP/1.0) is answered: a browser always sends one. Refused: 403 naming the host.
- **Origin.** Browsers send `Origin` on every cross-origin request (and on same-origin
  POSTs); other clients do not. A request with an `Origin` is answered only if CORS allows
  it (`cors_allow_origins`, sr.router.cors) or it is the request's own origin (its host and
  port equal `Host`, as behind a proxy that serves a page and sr under one name); with CORS
  off no foreign origin is allowed. Refused: 403 naming the origin.
- **Body type.** A POST whose `Content-Type` is not JSON (`application/json` or a
  `+json` type, any parameters) is refused with 415: the types a page may send without a
  preflight (text/plain, forms) are never JSON. A POST without `Content-Type` is taken as
  JSON: programs send that, and a browser never does cross-origin without `Origin`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from sr.errors import Forbidden, UnsupportedMediaType

_ANY = "*"
# Host values already answered, so that a request from a known name costs a dict lookup
# (parsing an address cost about 10 us a request). Bounded: names a caller makes up are
# checked every time, and refused ones are never kept.
_KNOWN_HOSTS_MAX = 64


def is_loopback_name(host: str) -> bool:
    """`localhost`, a `*.localhost` name, or a loopback address literal (no port)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(authority: str) -> str:
    """The name of a `Host` value or an origin's authority, without its port."""
    if authority.startswith("["):
        end = authority.find("]")
        return authority[: end + 1] if end > 0 else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


class FrontDoorGuard:
    """The three rules above for one listener (`listen_host`: the address it binds)."""

    def __init__(self, listen_host: str, allowed_hosts: Iterable[str] = ()) -> None:
        names = {name.lower().rstrip(".") for name in allowed_hosts}
        self._any_host = _ANY in names or (not names and not is_loopback_name(listen_host))
        self._hosts = names - {_ANY}
        self._known: set[bytes] = set()  # Host values answered before

    def check_host(self, host: bytes | None) -> None:
        """Forbidden unless `Host` names this listener (see the module's rules)."""
        if host is None or self._any_host or host in self._known:
            return
        text = host.decode("latin-1").strip()
        name = host_name(text).lower().rstrip(".")
        if is_loopback_name(name) or name in self._hosts:
            if len(self._known) < _KNOWN_HOSTS_MAX:
                self._known.add(host)
            return
        raise Forbidden(
            f"Host: {text!r} is not a name this listener answers to; list it in the "
            "listener's allowed_hosts"
        )

    @staticmethod
    def check_origin(origin: bytes, cors_allows: bool, host: bytes | None) -> None:
        """Forbidden for a foreign `Origin` that CORS does not allow."""
        if cors_allows:
            return
        text = origin.decode("latin-1")
        authority = text.partition("://")[2]
        if host is not None and authority and authority.lower() == host.decode("latin-1").lower():
            return  # the request's own origin
        raise Forbidden(
            f"Origin: {text!r} is not allowed to call this server; list it in the "
            "listener's cors_allow_origins"
        )


def check_json_body(content_type: bytes | None) -> None:
    """UnsupportedMediaType (415) for a POST body declared as anything but JSON."""
    if content_type is None:
        return
    media = content_type.split(b";", 1)[0].strip().lower()
    if media == b"application/json":
        return
    if media.startswith(b"application/") and media.endswith(b"+json"):
        return
    raise UnsupportedMediaType(
        f"Content-Type: {media.decode('latin-1')!r} is not supported; send application/json"
    )
