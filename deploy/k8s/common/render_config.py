"""Write the config an sr pod serves: its ConfigMap's config plus the API keys of a Secret.

    python render_config.py SOURCE TARGET      (environment: SR_API_KEYS)

sr reads listener API keys only from its config file (docs/security.md) and a ConfigMap is
no place for a secret, so an init container runs this script before `sr serve` starts:

- SOURCE (the ConfigMap's file) is read and validated by sr's own loader;
- `listeners[0].api_keys` becomes SR_API_KEYS split on commas (several keys let a key be
  rotated: serve old and new, move the clients, drop the old);
- TARGET is written with mode 0600 (an emptyDir only this pod mounts) by sr's atomic writer,
  in the canonical form, so `sr serve` finds nothing to rewrite.

It refuses, exit status 1 with one line naming the cause, an invalid config, and a config
whose listener is not loopback and would have no key: such a pod would answer anyone who
reaches it. Nothing is written then, so the pod never starts with a config it should not.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Mapping

from sr.config.load import load_config, validate, write_config_atomic
from sr.errors import ConfigError

KEYS_ENV = "SR_API_KEYS"


def api_keys_from_env(value: str) -> list[str]:
    """Comma-separated keys; blanks around them and empty items are dropped."""
    return [key.strip() for key in value.split(",") if key.strip()]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def render(source: str, target: str, env: Mapping[str, str]) -> int:
    """Write TARGET; the number of keys it holds. Raises ConfigError (a bad config) or
    ValueError (a listener beyond loopback with no key)."""
    cfg = load_config(source)
    keys = api_keys_from_env(env.get(KEYS_ENV, ""))
    if keys:
        cfg.listeners[0].api_keys = keys
    listener = cfg.listeners[0]
    if not listener.api_keys and not is_loopback(listener.host):
        raise ValueError(
            f"listeners[0].host is {listener.host!r} and there is no API key: "
            f"set {KEYS_ENV} (from the Secret) or api_keys in the config"
        )
    issues = validate(cfg)
    if issues:
        raise ConfigError(issues)
    previous = os.umask(0o077)  # a new file is created 0600: it holds the keys
    try:
        write_config_atomic(target, cfg)
    finally:
        os.umask(previous)
    return len(listener.api_keys)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: render_config.py SOURCE TARGET", file=sys.stderr)
        return 2
    try:
        count = render(argv[1], argv[2], os.environ)
    except ConfigError as error:
        lines = "; ".join(str(issue) for issue in error.issues)
        print(f"render_config: {argv[1]}: {lines}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as error:
        print(f"render_config: {error}", file=sys.stderr)
        return 1
    print(f"render_config: wrote {argv[2]} with {count} API key(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
