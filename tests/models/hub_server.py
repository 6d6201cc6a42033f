"""A loopback imitation of the Hugging Face Hub: just what `snapshot_download` needs.

huggingface_hub 2.4.0's `snapshot_download(repo_id, revision=...)` asks, in order:
  GET  /api/models/{repo}/revision/{rev}          -> {"id", "sha", "siblings"}  (repo_info)
  GET  /api/models/{repo}/tree/{commit}?recursive -> [{"type", "path", "oid", "size", "lfs"}]
  HEAD /{repo}/resolve/{commit}/{file}            -> X-Repo-Commit, ETag, Content-Length;
       an LFS file (weights) answers 302 to a CDN instead, with X-Linked-Etag (its sha256),
       X-Linked-Size and Location, as the real Hub does
  GET  /{repo}/resolve/{commit}/{file} or the CDN Location -> the bytes
Errors carry the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which
huggingface_hub turns into its typed exceptions. The CDN is a second server (another port,
so another origin): huggingface_hub must not send it the Authorization header.

`HubServer(repos, token=...)` runs both on 127.0.0.1 in daemon threads and records every
request (`requests`); `fetched(repo_id)` lists the repository files whose bytes were sent.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt")


def commit_id(text: str) -> str:
    """A deterministic 40-hex commit hash (what the Hub's revisions resolve to)."""
    return hashlib.sha1(text.encode()).hexdigest()


def git_blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def read_folder(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, keyed by its repository path (`/`-separated)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@dataclass
class HubRepo:
    commits: dict[str, dict[str, bytes]]  # 40-hex commit -> {path: bytes}
    refs: dict[str, str]  # branch or tag -> commit
    private: bool = False  # answered only with the server's token


@dataclass
class Seen:
    server: str  # "hub" or "cdn"
    method: str
    path: str  # as sent (quoted)
    headers: dict[str, str]  # lower-case names


@dataclass
class _State:
    repos: dict[str, HubRepo]
    token: str | None
    cdn_url: str = ""
    requests: list[Seen] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> bytes
    lock: threading.Lock = field(default_factory=threading.Lock)
    connections: set[socket.socket] = field(default_factory=set)


def _handler(state: _State, server_name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # quiet
            pass

        def setup(self):
            super().setup()
            with state.lock:
                state.connections.add(self.connection)

        def finish(self):
            with state.lock:
                state.connections.discard(self.connection)
            super().finish()

        def do_HEAD(self):
            self._route(body=False)

        def do_GET(self):
            self._route(body=True)

        def _route(self, *, body: bool) -> None:
            with state.lock:
                state.requests.append(
                    Seen(
                        server_name,
                        self.command,
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                    )
                )
            raw = urlsplit(self.path).path
            segments = [unquote(s) for s in raw.split("/")[1:]]
            try:
                if server_name == "cdn":
                    return self._cdn(segments, body)
                if segments[:2] == ["api", "models"]:
                    return self._api(segments[2:])
                if len(segments) >= 5 and segments[2] == "resolve":
                    return self._resolve(segments, body)
                self._reply(404, b"not found", {})
            except _Reply as reply:
                self._reply(reply.status, reply.body, reply.headers, body=body)

        # -- helpers ---------------------------------------------------------------
        def _reply(self, status, payload: bytes, headers: dict, *, body: bool = True) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(payload)

        def _json(self, value) -> None:
            self._reply(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def _repo(self, repo_id: str) -> HubRepo:
            auth = self.headers.get("Authorization")
            if auth is not None and state.token is not None and auth != f"Bearer {state.token}":
                raise _Reply(
                    401, {"X-Error-Message": "Invalid credentials in Authorization header"}
                )
            repo = state.repos.get(repo_id)
            if repo is None or (repo.private and auth is None):
                code = 401 if repo is not None else 404
                raise _Reply(
                    code,
                    {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                )
            return repo

        def _commit(self, repo: HubRepo, revision: str) -> str:
            if revision in repo.commits:
                return revision
            if revision in repo.refs:
                return repo.refs[revision]
            raise _Reply(
                404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev"}
            )

        # -- /api/models/... ---------------------------------------------------------
        def _api(self, rest: list[str]) -> None:
            repo_id = "/".join(rest[:2])
            repo = self._repo(repo_id)
            if len(rest) == 2 or (len(rest) == 4 and rest[2] == "revision"):
                commit = self._commit(repo, rest[3] if len(rest) == 4 else "main")
                files = repo.commits[commit]
                return self._json(
                    {
                        "id": repo_id,
                        "modelId": repo_id,
                        "sha": commit,
                        "private": repo.private,
                        "siblings": [{"rfilename": p} for p in files],
                    }
                )
            if len(rest) >= 4 and rest[2] == "tree":
                commit = self._commit(repo, rest[3])
                return self._json(_tree(repo.commits[commit]))
            raise _Reply(404, {})

        # -- /{repo}/resolve/{revision}/{file} --------------------------------------
        def _resolve(self, segments: list[str], body: bool) -> None:
            repo_id = "/".join(segments[:2])
            repo = self._repo(repo_id)
            commit = self._commit(repo, segments[3])
            filename = "/".join(segments[4:])
            files = repo.commits[commit]
            if filename not in files:
                raise _Reply(
                    404,
                    {
                        "X-Error-Code": "EntryNotFound",
                        "X-Error-Message": "Entry not found",
                        "X-Repo-Commit": commit,
                    },
                )
            content = files[filename]
            if filename.endswith(LFS_SUFFIXES):
                sha256 = hashlib.sha256(content).hexdigest()
                with state.lock:
                    state.blobs[sha256] = content
                location = f"{state.cdn_url}/blobs/{sha256}/{quote(filename)}"
                return self._reply(
                    302,
                    b"",
                    {
                        "Location": location,
                        "X-Repo-Commit": commit,
                        "X-Linked-Etag": f'"{sha256}"',
                        "X-Linked-Size": str(len(content)),
                        "ETag": f'"{git_blob_id(content)}"',
                    },
                )
            self._reply(
                200,
                content,
                {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(content)}"'},
                body=body,
            )

        # -- the CDN: /blobs/{sha256}/{file} ------------------------------------------
        def _cdn(self, segments: list[str], body: bool) -> None:
            content = state.blobs.get(segments[1]) if len(segments) > 2 else None
            if content is None:
                raise _Reply(404, {})
            self._reply(200, content, {"Content-Type": "application/octet-stream"}, body=body)

    return Handler


class _Reply(Exception):
    def __init__(self, status: int, headers: dict, body: bytes = b""):
        super().__init__(status)
        self.status, self.headers, self.body = status, headers, body


def _tree(files: dict[str, bytes]) -> list[dict]:
    entries: list[dict] = []
    folders = sorted(
        {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    )
    for folder in folders:
        entries.append({"type": "directory", "oid": commit_id(folder), "size": 0, "path": folder})
    for path, content in files.items():
        entry = {"type": "file", "oid": git_blob_id(content), "size": len(content), "path": path}
        if path.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(content).hexdigest()
            entry["lfs"] = {"oid": sha256, "size": len(content), "pointerSize": 134}
        entries.append(entry)
    return entries


class HubServer:
    """The imitation Hub (`url`) and its CDN, on loopback, for a `with` block."""

    def __init__(self, repos: dict[str, HubRepo], *, token: str | None = None):
        self._state = _State(repos=repos, token=token)
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._state, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._state, "cdn"))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        self._state.cdn_url = self.cdn_url
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> HubServer:
        for server in (self._hub, self._cdn):
            thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()
        # Kept-alive connections outlive the listener; a later server on the same port
        # must not find a client still talking to this one.
        with self._state.lock:
            connections = list(self._state.connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def requests(self) -> list[Seen]:
        with self._state.lock:
            return list(self._state.requests)

    def fetched(self, repo_id: str | None = None) -> list[str]:
        """Repository paths whose bytes were sent (GET on resolve, or on the CDN)."""
        paths = []
        for seen in self.requests:
            segments = [unquote(s) for s in urlsplit(seen.path).path.split("/")[1:]]
            if seen.method != "GET":
                continue
            if seen.server == "cdn" and len(segments) > 2:
                paths.append("/".join(segments[2:]))
            elif (
                seen.server == "hub"
                and len(segments) >= 5
                and segments[2] == "resolve"
                and (repo_id is None or "/".join(segments[:2]) == repo_id)
            ):
                paths.append("/".join(segments[4:]))
        return sorted(paths)
