"""How the router reaches one attached worker (or a discovered fleet): its key and its CA.

Rules:
* a config names the environment variable that holds the key (`api_key_env`), never the
  key: configs are dumped and rewritten by sr. The variable is read once when the router
  starts and at each reload (`entry_accesses`); unset or empty is an error naming the
  field, not a worker that answers 401 forever;
* `ca_bundle` (https workers only: sr.config.validate) is loaded into one SSL context per
  entry when the router starts or reloads; an unreadable file is an error naming the field.
  Without it, https workers are verified against httpx's default bundle (certifi);
* managed workers (a private Unix socket) need neither;
* `fingerprint` changes when the key or the CA bundle's bytes change: a reload that
  changes either replaces the replicas reached this way (sr.pool.supervisor), so a new key or a
  renewed CA takes effect; it is a digest, never the key.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from sr.config.schema import Replica, SrConfig
from sr.pool.transport import HttpxTransport, Transport


class AccessError(Exception):
    """A replica's key or CA bundle cannot be used; the message starts with the field."""


@attrs.frozen
class WorkerAccess:
    api_key: str | None = attrs.field(default=None, repr=False)  # never shown
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, eq=False)
    fingerprint: str = ""  # "" without key and CA bundle

    def connector(self, tls_server_name: str | None = None) -> Callable[[str], Transport]:
        """A transport factory for base URLs of workers reached this way; `tls_server_name`
        is the name their certificates must carry when it is not the URL's host."""

        def connect(base_url: str) -> Transport:
            return HttpxTransport(
                base_url=base_url,
                api_key=self.api_key,
                ssl_context=self.ssl_context,
                tls_server_name=tls_server_name,
            )

        return connect


def access_for(replica: Replica, environ: Mapping[str, str]) -> WorkerAccess:
    """The key and TLS context of an attached replica entry; AccessError when unusable."""
    key = None
    if replica.api_key_env is not None:
        key = environ.get(replica.api_key_env, "")
        if not key.strip():
            raise AccessError(
                f"api_key_env: the environment variable {replica.api_key_env} is not set"
                " or empty; it must hold the key the workers were started with"
            )
        key = key.strip()
    context = None
    ca_digest = ""
    if replica.ca_bundle is not None:
        try:
            ca_digest = hashlib.sha256(Path(replica.ca_bundle).read_bytes()).hexdigest()
            context = ssl.create_default_context(cafile=replica.ca_bundle)
        except (OSError, ssl.SSLError) as error:
            why = getattr(error, "strerror", None) or str(error)
            raise AccessError(
                f"ca_bundle: cannot load {replica.ca_bundle!r} as a CA bundle: {why}"
            ) from None
    fingerprint = ""
    if key is not None or context is not None:
        material = f"{key or ''}\0{replica.ca_bundle or ''}\0{ca_digest}".encode()
        fingerprint = hashlib.sha256(material).hexdigest()[:16]
    return WorkerAccess(api_key=key, ssl_context=context, fingerprint=fingerprint)


def entry_accesses(
    config: SrConfig, failure: type[Exception], environ: Mapping[str, str]
) -> dict[tuple[str, int], WorkerAccess]:
    """(deployment, placement index) -> the access of each attached entry of `config`,
    keys looked up in `environ` (sr.settings); the first unusable one raises `failure`
    (StartupFailed, ReloadFailed) with its path."""
    out = {}
    for name, deployment in config.deployments.items():
        for index, placement in enumerate(deployment.placements()):
            if not placement.attached:
                continue
            try:
                out[(name, index)] = access_for(placement, environ)
            except AccessError as error:
                path = f"global.model_catalog.deployments.{name}"
                if deployment.replicas is not None:
                    path += f".replicas[{index}]"
                raise failure(f"{path}.{error}") from None
    return out
