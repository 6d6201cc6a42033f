"""Chaos harness: an `sr serve` subprocess with real workers, faults, bounded load, reports.

Everything is loopback and bounded: every wait has a deadline, every request a client
timeout a little past its own deadline, so a hung request shows up as `lost`, never as a
hung test.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = {  # SPEC section 8: status -> the error codes that status may carry
    400: {"invalid_request"},
    401: {"invalid_api_key"},
    404: {"model_not_found"},
    413: {"request_too_large"},
    502: {"worker_failed"},
    503: {"overloaded", "unavailable"},
    504: {"timeout"},
}
CLIENT_SLACK_S = 3.0  # a request still unanswered this long past its deadline is lost


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def deployment_config(
    artifact: Path,
    replicas: int,
    *,
    timeout_ms: int | None = None,
    outlier: dict[str, int] | None = None,
    api_keys: list[str] | None = None,
) -> dict[str, Any]:
    primary: dict[str, Any] = {
        "artifact": str(artifact),
        "replicas": [{"device": "cpu"} for _ in range(replicas)],
    }
    if timeout_ms is not None:
        primary["timeout_ms"] = timeout_ms
    if outlier is not None:
        primary["outlier_detection"] = outlier
    return {
        "global": {
            "model_catalog": {
                "deployments": {"primary": primary},
                "system": {"decision_model": {"deployment": "primary"}},
            }
        },
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": api_keys or []}],
    }


class ServeProcess:
    """`python -m sr serve` on a free loopback port, with SR_FAULT_INJECTION=1."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str] | None = None):
        self.workdir = workdir
        self.config_path = workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "VLLM_SRUN_CPU_THREADS": "1",
            "VLLM_SRUN_READY_TIMEOUT": "60s",
            "SR_FAULT_INJECTION": "1",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.headers: dict[str, str] = {}
        self.seen_pids: set[int] = set()  # every worker pid the inventory ever showed

    def start(self, timeout_s: float = 60.0, all_ready: bool = True) -> ServeProcess:
        argv = [sys.executable, "-m", "sr", "serve", "--config", str(self.config_path)]
        argv += ["--port", str(self.port)]
        out_path, err_path = self.workdir / "stdout.txt", self.workdir / "stderr.txt"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, cwd=self.workdir, env=self.env, stdout=out, stderr=err
            )
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=5.0, headers=self.headers) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"sr serve exited {self.proc.returncode}: {self.logs()}")
                try:
                    if client.get("/ready").status_code == 200:
                        if not all_ready:
                            return self
                        rows = client.get("/api/v1/inventory/model-runtime").json()
                        replicas = self._note(rows["deployments"]["primary"]["replicas"])
                        if all(r["state"] == "ready" for r in replicas):
                            return self
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise AssertionError(f"sr serve not ready in {timeout_s}s: {self.logs()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def logs(self) -> str:
        out = (self.workdir / "stdout.txt").read_text(errors="replace")
        err = (self.workdir / "stderr.txt").read_text(errors="replace")
        return f"\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-4000:]}"

    def stderr_text(self) -> str:
        return (self.workdir / "stderr.txt").read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        """The router's JSON event lines named `name`, in order."""
        found = []
        for line in self.stderr_text().splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == name:
                found.append(record)
        return found

    # -- sync views (outside load) ----------------------------------------------------
    def inventory(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, timeout=5.0, headers=self.headers) as client:
            return client.get("/api/v1/inventory/model-runtime").json()

    def replicas(self) -> list[dict[str, Any]]:
        return self._note(self.inventory()["deployments"]["primary"]["replicas"])

    async def replicas_async(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        answer = await client.get("/api/v1/inventory/model-runtime")
        return self._note(answer.json()["deployments"]["primary"]["replicas"])

    def _note(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.seen_pids.update(r["pid"] for r in rows if r.get("pid"))
        return rows


# -- async views -------------------------------------------------------------------------


async def wait_until(
    check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05
) -> Any:
    """Poll an async `check` until it returns something truthy; AssertionError after timeout."""
    last = None
    with trio.move_on_after(timeout_s):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(poll_s)
    raise AssertionError(f"not within {timeout_s}s: {what}; last: {last!r}")


# -- faults --------------------------------------------------------------------------------
def worker_socket(pid: int) -> str:
    """The Unix socket a managed worker listens on, read from its command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--uds") + 1].decode()


async def set_worker_fault(pid: int, mode: str, slow_ms: int = 0) -> dict[str, Any]:
    """`POST /admin/faults` straight at a worker's socket (the worker's own contract)."""
    transport = httpx.AsyncHTTPTransport(uds=worker_socket(pid))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=5) as c:
        answer = await c.post("/admin/faults", json={"mode": mode, "slow_ms": slow_ms})
        answer.raise_for_status()
        return answer.json()


# -- load ----------------------------------------------------------------------------------
@attrs.define
class Result:
    index: int
    started: float
    latency_s: float
    status: int | None  # None: no HTTP answer (lost)
    code: str  # "ok", the error code, or "lost:<why>"
    replica: str | None = None
    retry_after: str | None = None


def classify(answer: httpx.Response) -> str:
    if 200 <= answer.status_code < 300:
        return "ok"
    try:
        code = answer.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"malformed:{answer.status_code}"
    return str(code)


async def one_request(
    client: httpx.AsyncClient,
    index: int,
    *,
    deadline_ms: int | None,
    path: str = "/v1/embeddings",
    body: dict[str, Any] | None = None,
    client_timeout_s: float = 10.0,
) -> Result:
    payload = body or {"model": "primary", "input": [f"chaos request {index}", "second row"]}
    headers = {"X-Request-Timeout-Ms": str(deadline_ms)} if deadline_ms else {}
    started = time.monotonic()
    try:
        with trio.fail_after(client_timeout_s):
            answer = await client.post(path, json=payload, headers=headers)
    except trio.TooSlowError:
        return Result(index, started, time.monotonic() - started, None, "lost:hung")
    except httpx.HTTPError as error:
        why = f"lost:{type(error).__name__}"
        return Result(index, started, time.monotonic() - started, None, why)
    return Result(
        index,
        started,
        time.monotonic() - started,
        answer.status_code,
        classify(answer),
        answer.headers.get("x-sr-replica"),
        answer.headers.get("retry-after"),
    )


async def steady_load(
    client: httpx.AsyncClient,
    total: int,
    concurrency: int,
    *,
    deadline_ms: int | None,
    on_sent: Callable[[int], Any] | None = None,
    pace_s: float = 0.0,
    client_timeout_s: float = 10.0,
) -> list[Result]:
    """`total` requests through `concurrency` lanes; `on_sent(i)` may await a fault."""
    results: list[Result] = []
    counter = iter(range(total))

    async def lane() -> None:
        for index in counter:
            if on_sent is not None:
                await on_sent(index)
            results.append(
                await one_request(
                    client, index, deadline_ms=deadline_ms, client_timeout_s=client_timeout_s
                )
            )
            if pace_s:
                await trio.sleep(pace_s)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(lane)
    return sorted(results, key=lambda r: r.index)


def async_client(url: str, connections: int = 128, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(30.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        **kw,
    )


# -- checks and reports --------------------------------------------------------------------
def counts(results: Iterable[Result]) -> dict[str, int]:
    tally = collections.Counter(r.code for r in results)
    return dict(sorted(tally.items()))


def undocumented(results: Iterable[Result]) -> list[Result]:
    """Answers that are neither 2xx nor a documented (status, code) pair, or lost."""
    bad = []
    for r in results:
        if r.code == "ok" and r.status is not None and 200 <= r.status < 300:
            continue
        if r.status is not None and r.code in DOCUMENTED.get(r.status, ()):
            continue
        bad.append(r)
    return bad


def report(scenario: str, results: list[Result], **extra: Any) -> dict[str, Any]:
    """Print the tally and append one row to $SR_CHAOS_REPORT (a JSON list), if set."""
    tally = counts(results)
    lost = sum(n for code, n in tally.items() if code.startswith("lost"))
    row = {
        "scenario": scenario,
        "sent": len(results),
        "ok": tally.get("ok", 0),
        "errors": {k: v for k, v in tally.items() if k != "ok" and not k.startswith("lost")},
        "lost": lost,
        "max_latency_ms": round(max((r.latency_s for r in results), default=0) * 1000),
        **extra,
    }
    print(f"\nchaos[{scenario}] " + json.dumps(row, sort_keys=True))
    target = os.environ.get("SR_CHAOS_REPORT")
    if target:
        path = Path(target)
        rows = json.loads(path.read_text()) if path.exists() and path.stat().st_size else []
        rows = [r for r in rows if r.get("scenario") != scenario] + [row]
        path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return row


def wait_gone(pids: Iterable[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still alive after up to `timeout_s` (an empty list once all are gone)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive
