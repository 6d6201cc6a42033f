"""`sr serve` as a subprocess for end-to-end tests: config file, free port, bounded waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(
    path: Path,
    artifact: Path | str,
    replicas: int,
    api_keys: list[str] | None = None,
    consecutive_timeouts: int = 3,
):
    config = {
        "global": {
            "model_catalog": {
                "deployments": {
                    "primary": {
                        "artifact": str(artifact),
                        "replicas": [{"device": "cpu"} for _ in range(replicas)],
                        "outlier_detection": {"consecutive_timeouts": consecutive_timeouts},
                    }
                },
                "system": {"decision_model": {"deployment": "primary"}},
            }
        },
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": api_keys or []}],
    }
    path.write_text(yaml.safe_dump(config))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes; its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class RouterProcess:
    def __init__(self, workdir: Path, env: dict[str, str] | None = None):
        self.workdir = workdir
        self.config_path = workdir / "config.yaml"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "VLLM_SRUN_CPU_THREADS": "1",
            "VLLM_SRUN_READY_TIMEOUT": "60s",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    def start(self, ready_timeout_s: float = 40.0) -> RouterProcess:
        command = [sys.executable, "-m", "sr", "serve", "--config", str(self.config_path)]
        command += ["--port", str(self.port)]
        self.stdout = open(self.workdir / "stdout.txt", "w")  # noqa: SIM115
        self.stderr = open(self.workdir / "stderr.txt", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command, cwd=self.workdir, env=self.env, stdout=self.stdout, stderr=self.stderr
        )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sr serve exited {self.proc.returncode}: {self.logs()}")
            try:
                # /ready means one ready replica per deployment; tests want them all.
                if self.client.get("/ready").status_code == 200 and self.all_ready():
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"sr serve not ready in {ready_timeout_s}s: {self.logs()}")

    def logs(self) -> str:
        out = (self.workdir / "stdout.txt").read_text()
        err = (self.workdir / "stderr.txt").read_text()
        return f"\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"

    def inventory(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        return self.client.get("/api/v1/inventory/model-runtime", headers=headers).json()

    def all_ready(self) -> bool:
        deployments = self.inventory()["deployments"].values()
        return all(d["ready_replicas"] == d["desired_replicas"] for d in deployments)

    def replicas(self) -> list[dict[str, Any]]:
        return self.inventory()["deployments"]["primary"]["replicas"]

    def worker_pids(self) -> list[int]:
        return [r["pid"] for r in self.replicas() if r.get("pid")]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for stream in (getattr(self, "stdout", None), getattr(self, "stderr", None)):
            if stream is not None:
                stream.close()


def worker_socket(pid: int) -> str:
    """The Unix socket a managed worker listens on, from its command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--uds") + 1].decode()


def set_fault(pid: int, mode: str, slow_ms: int = 0) -> None:
    transport = httpx.HTTPTransport(uds=worker_socket(pid))
    with httpx.Client(transport=transport, base_url="http://worker", timeout=5) as client:
        answer = client.post("/admin/faults", json={"mode": mode, "slow_ms": slow_ms})
        answer.raise_for_status()
