"""Shared pieces of the benchmarks: result files, percentiles, tables, and `sr serve` runs.

Every benchmark prints a table and writes one JSON file under bench/results/ (gitignored);
`python -m bench` reads those files back to write bench/results/report.md (the tables
docs/benchmarks.md is kept from).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every input a benchmark sends is unique within and across runs, so neither the router's
# nor the worker's result cache ever answers.
_RUN_ID = f"{os.getpid()}-{time.time_ns()}"
_UNIQUE = itertools.count()
RESULTS = ROOT / "bench" / "results"


def _pythonpath() -> str:
    """This checkout first, then whatever PYTHONPATH the caller set."""
    extra = os.environ.get("PYTHONPATH")
    return f"{ROOT}{os.pathsep}{extra}" if extra else str(ROOT)


def host_info() -> dict:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def write_result(name: str, result: dict) -> Path:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "host": host_info()}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def read_result(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (nan if empty)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_summary(latencies_s: list[float], wall_s: float, errors: int = 0) -> dict:
    ordered = sorted(latencies_s)
    ms = [v * 1000 for v in ordered]
    return {
        "requests": len(ordered),
        "errors": errors,
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p90_ms": round(percentile(ms, 0.90), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "throughput_rps": round(len(ordered) / wall_s, 1) if wall_s > 0 else 0.0,
    }


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in header], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """`sr serve` with one deployment `primary` of `replicas` CPU workers, cache off."""

    def __init__(
        self,
        artifact: str,
        workdir: Path,
        *,
        replicas: int = 1,
        threads: int = 1,
        pythonpath: str | None = None,
        kernel: str | None = None,
        engine: str | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        """`pythonpath`: the tree whose `sr` serves (default this checkout's, as
        `_pythonpath`); bench_memory passes a baseline revision's tree. `kernel`: the
        deployment's `kernel` (None: left out, the host's probe picks). `engine`: the
        deployment's `engine` (None: left out, torch). `args`, `env`: more `sr serve`
        flags and environment variables."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / f"config-{self.port}.yaml"
        rows = ", ".join("{device: cpu}" for _ in range(replicas))
        config.write_text(
            "global:\n  model_catalog:\n    deployments:\n      primary:\n"
            f"        artifact: {json.dumps(artifact)}\n        replicas: [{rows}]\n"
            + (f"        kernel: {kernel}\n" if kernel else "")
            + (f"        engine: {engine}\n" if engine else "")
            + f"listeners:\n  - {{host: 127.0.0.1, port: {self.port}}}\n"
        )
        path = pythonpath or _pythonpath()
        env = {**os.environ, "PYTHONPATH": path, "VLLM_SRUN_RESULT_CACHE": "0", **(env or {})}
        argv = [sys.executable, "-m", "sr", "serve", "--config", str(config)]
        argv += ["--port", str(self.port), "--threads", str(threads), *args]
        self.proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.artifact = artifact
        self.worker_sockets: list[str] = []
        self.worker_pids: list[int] = []
        self.served_artifact = artifact

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time so far of the router process and of all its workers together."""
        return {
            "router": cpu_seconds(self.proc.pid),
            "workers": sum(cpu_seconds(pid) for pid in self.worker_pids),
        }

    def wait_ready(self, timeout_s: float = 180.0) -> ServeProcess:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"sr serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    self._find_workers()
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"sr serve did not become ready in {timeout_s:.0f} s")

    def _find_workers(self) -> None:
        import httpx

        inventory = httpx.get(self.url + "/api/v1/inventory/model-runtime", timeout=5).json()
        deployment = inventory["deployments"]["primary"]
        self.served_artifact = deployment["artifact"]
        self.worker_sockets = []
        self.worker_pids = [replica["pid"] for replica in deployment["replicas"]]
        for replica in deployment["replicas"]:
            args = Path(f"/proc/{replica['pid']}/cmdline").read_bytes().split(b"\0")
            self.worker_sockets.append(args[args.index(b"--uds") + 1].decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ServeProcess:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def embedded_artifact() -> str:
    from sr.models import EMBEDDED_DEFAULT

    return EMBEDDED_DEFAULT


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WorkerProcess:
    """`sr worker` on a Unix socket in `workdir`, for benchmarks that skip the router."""

    def __init__(self, artifact: str, workdir: Path, *, threads: int = 1):
        self.socket = str(workdir / f"worker-{os.getpid()}-{id(self)}.sock")
        argv = [sys.executable, "-m", "sr", "worker", "--artifact", artifact]
        argv += ["--threads", str(threads), "--uds", self.socket]
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def wait_ready(self, timeout_s: float = 120.0) -> WorkerProcess:
        import httpx

        deadline = time.monotonic() + timeout_s
        transport = httpx.HTTPTransport(uds=self.socket)
        with httpx.Client(transport=transport, base_url="http://worker") as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise SystemExit(f"sr worker exited with {self.proc.returncode}")
                try:
                    if client.get("/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.stop()
        raise SystemExit(f"sr worker not ready in {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> WorkerProcess:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tiny_artifact(workdir: Path) -> str:
    from sr.models.testing import write_tiny_bert

    return str(write_tiny_bert(workdir / "tiny", seed=0))


def unique_text(prefix: str = "bench") -> str:
    """A short input never sent before (no result cache can answer it)."""
    return f"{prefix} sentence number {_RUN_ID}.{next(_UNIQUE)}"


def http_client(target: str):
    """A load-generator client: sr.http.client (cheap per request, so the client takes less
    of the shared CPUs than httpx would). `target` is a socket path or http://host:port."""
    import trio

    from sr.http.client import Http1Pool

    if not target.startswith("http://"):
        return Http1Pool(uds=target, max_idle=256)
    host, port = target.removeprefix("http://").rsplit(":", 1)

    class TcpPool(Http1Pool):
        """The router's front door is TCP; sr's own hop client speaks only Unix sockets."""

        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            # The router answers only the Host names of its listener (sr.router.guard).
            self._host_header = f"{host}:{port}".encode()

        async def _open_stream(self):
            return await trio.open_tcp_stream(host, int(port))

    return TcpPool(uds=target, max_idle=256)


async def drive(
    client,
    model: str,
    concurrency: int,
    seconds: float,
    *,
    prefix: str = "bench",
    pause_after_error_s: float = 0.005,
) -> dict:
    """Closed loop: `concurrency` callers each send POST /v1/embeddings (one unique short
    input, so no cache answers) back to back for `seconds`. A caller turned away (503 when
    every worker holds its 32 requests) pauses briefly, as a real client would, instead of
    spinning on the router."""
    import trio

    latencies: list[float] = []
    errors = 0

    async def caller() -> None:
        nonlocal errors
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            text = unique_text(prefix)
            body = json.dumps({"model": model, "input": text}).encode()
            started = time.perf_counter()
            status, _, _ = await client.request("POST", "/v1/embeddings", body)
            if status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1
                await trio.sleep(pause_after_error_s)

    wall = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(caller)
    return latency_summary(latencies, time.perf_counter() - wall, errors) | {
        "latencies_ms": sorted(round(v * 1000, 3) for v in latencies)
    }


def merge_runs(runs: list[dict]) -> dict:
    """Combine interleaved runs of one setup into one summary (latencies pooled)."""
    latencies = sorted(v for r in runs for v in r["latencies_ms"])
    wall = sum(r["requests"] / r["throughput_rps"] for r in runs if r["throughput_rps"])
    summary = latency_summary([v / 1000 for v in latencies], wall, sum(r["errors"] for r in runs))
    return summary
