"""`python -m sr serve` as a subprocess on a free loopback port, for e2e, chaos and hostile tests.

One class, one config builder, one set of process helpers: every wait has a deadline and
`stop()` leaves no router or worker process behind.
"""

from __future__ import annotations

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

import httpx
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
INVENTORY_PATH = "/api/v1/inventory/model-runtime"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes; its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_gone(pids: Iterable[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still alive after up to `timeout_s` (an empty list once all are gone)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def poll_until(check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> Any:
    """Call `check` until it returns something truthy; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"not within {timeout_s}s: {what}; last: {last!r}")


def serve_config(
    artifact: Path | str,
    replicas: int,
    *,
    timeout_ms: int | None = None,
    outlier: dict[str, int] | None = None,
    api_keys: list[str] | None = None,
) -> dict[str, Any]:
    """One deployment `primary` of `replicas` CPU workers, also the decision model."""
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
        # The port here is overridden by `--port`; the listener carries the API keys.
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": api_keys or []}],
    }


# -- worker admin (the worker's own contract, straight at its Unix socket) -----------------
def worker_socket(pid: int) -> str:
    """The Unix socket a managed worker listens on, read from its command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--uds") + 1].decode()


def _fault(mode: str, slow_ms: int) -> dict[str, Any]:
    return {"mode": mode, "slow_ms": slow_ms}


def set_fault(pid: int, mode: str, slow_ms: int = 0) -> dict[str, Any]:
    """`POST /admin/faults` on a worker (needs SR_FAULT_INJECTION=1 at its start)."""
    transport = httpx.HTTPTransport(uds=worker_socket(pid))
    with httpx.Client(transport=transport, base_url="http://worker", timeout=5) as client:
        answer = client.post("/admin/faults", json=_fault(mode, slow_ms))
        answer.raise_for_status()
        return answer.json()


async def set_fault_async(pid: int, mode: str, slow_ms: int = 0) -> dict[str, Any]:
    """`set_fault` for code running under trio."""
    transport = httpx.AsyncHTTPTransport(uds=worker_socket(pid))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=5) as c:
        answer = await c.post("/admin/faults", json=_fault(mode, slow_ms))
        answer.raise_for_status()
        return answer.json()


class ServeProcess:
    """`python -m sr serve --config <workdir>/config.yaml --port <free port>`.

    `headers` go with every request this object makes (the API key); `seen_pids` collects
    every worker pid the inventory ever showed, so a test can check none outlives the router.
    """

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any] | None = None,
        *,
        env: dict[str, str] | None = None,
        fault_injection: bool = False,
        headers: dict[str, str] | None = None,
        args: list[str] | None = None,
    ):
        """`args`: more `sr serve` flags."""
        self.workdir = workdir
        self.args = list(args or [])
        self.config_path = workdir / "config.yaml"
        if config is not None:
            self.configure(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "VLLM_SRUN_CPU_THREADS": "1",
            "VLLM_SRUN_READY_TIMEOUT": "60s",
            "SR_FAULT_INJECTION": "1" if fault_injection else "0",
            **(env or {}),
        }
        self.headers = dict(headers or {})
        self.client = httpx.Client(base_url=self.url, timeout=10.0, headers=self.headers)
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()

    def configure(self, config: dict[str, Any]) -> None:
        """(Re)write the config file; a running router reads it on reload or SIGHUP."""
        self.config_path.write_text(yaml.safe_dump(config))

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0, all_ready: bool = True) -> ServeProcess:
        """Start and wait for /ready (one ready replica per deployment) and, unless
        `all_ready` is False, for every replica of every deployment."""
        argv = [sys.executable, "-m", "sr", "serve", "--config", str(self.config_path)]
        argv += ["--port", str(self.port), *self.args]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, cwd=self.workdir, env=self.env, stdout=out, stderr=err
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sr serve exited {self.proc.returncode}: {self.logs()}")
            try:
                if self.client.get("/ready").status_code == 200 and (
                    not all_ready or self.all_ready()
                ):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"sr serve not ready in {timeout_s}s: {self.logs()}")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> list[int]:
        """SIGINT (SIGKILL after 30 s), then kill any worker that outlived the router.

        Returns those orphaned worker pids so a caller can assert there were none."""
        self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        orphans = wait_gone(self.seen_pids)
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return orphans

    # -- output --------------------------------------------------------------------------
    @property
    def stdout_path(self) -> Path:
        return self.workdir / "stdout.txt"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "stderr.txt"

    def stdout_text(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def logs(self) -> str:
        """The tails of both streams, for assertion messages."""
        out, err = self.stdout_text()[-3000:], self.stderr_text()[-4000:]
        return f"\n--- stdout\n{out}\n--- stderr\n{err}"

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

    # -- inventory -----------------------------------------------------------------------
    def inventory(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The inventory; `headers` add to (or replace) this object's own."""
        rows = self.client.get(INVENTORY_PATH, headers=headers).json()
        for deployment in rows["deployments"].values():
            self._note(deployment["replicas"])
        return rows

    def all_ready(self) -> bool:
        """Every replica of every deployment ready (/ready needs only one per deployment)."""
        deployments = self.inventory()["deployments"].values()
        return all(
            d["ready_replicas"] == d["desired_replicas"]
            and all(r["state"] == "ready" for r in d["replicas"])
            for d in deployments
        )

    def wait_all_ready(self, timeout_s: float = 10.0) -> None:
        try:
            poll_until(self.all_ready, timeout_s, "every replica ready")
        except AssertionError as error:
            raise AssertionError(f"{error}: {self.replicas()}") from None

    def replicas(self, deployment: str = "primary") -> list[dict[str, Any]]:
        return self.inventory()["deployments"][deployment]["replicas"]

    async def replicas_async(
        self, client: httpx.AsyncClient, deployment: str = "primary"
    ) -> list[dict[str, Any]]:
        """`replicas` through the caller's async client (under trio, during load)."""
        answer = await client.get(INVENTORY_PATH, headers=self.headers)
        return self._note(answer.json()["deployments"][deployment]["replicas"])

    def worker_pids(self, deployment: str = "primary") -> list[int]:
        return [r["pid"] for r in self.replicas(deployment) if r.get("pid")]

    def _note(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.seen_pids.update(r["pid"] for r in rows if r.get("pid"))
        return rows
