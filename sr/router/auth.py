"""Bearer API keys on the listener.

Every configured key is compared with `hmac.compare_digest`, without stopping at the first
match, so the time taken does not tell a caller how close a guess came or which key matched.
Keys are never logged or echoed.
"""

from __future__ import annotations

import hmac

# Routes an orchestrator probes without credentials.
OPEN_PATHS = frozenset({"/health", "/ready"})


class ApiKeyCheck:
    def __init__(self, api_keys: list[str]):
        self._keys = [key.encode() for key in api_keys]

    @property
    def enabled(self) -> bool:
        """Whether any key is configured (else every route is open)."""
        return bool(self._keys)

    def allows(self, path: str, authorization: bytes | None) -> bool:
        """True if the request may proceed: open path, no keys configured, or a valid key."""
        if not self._keys or path in OPEN_PATHS:
            return True
        if authorization is None:
            return False
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(token, key)
        return matched
