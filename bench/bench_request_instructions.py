"""CPU instructions per request of the router and of a worker, as `sr serve` runs them.

    python -m bench.bench_request_instructions [--baseline REV] [--runs 2] [--requests 400]
                                               [--only router|worker]

bench/bench_instructions.py counts sr's HTTP server with a handler that answers at once;
this counts the two real processes one request crosses, each under valgrind's callgrind
(user-space instructions, nearly deterministic where time is not):

* router: `sr serve` on a tiny BERT with one CPU worker (result cache off). The router
  process runs under callgrind with instrumentation off while it starts (its workers are
  separate, untraced processes); then instrumentation goes on, WARMUP requests are sent
  and the counters dumped, then `--requests` more and dumped again: the second dump over
  its request count is what one request costs the router (parse, admission, dispatch,
  the hop to the worker and the answer's relay; the timers that run meanwhile included).
* worker: `sr worker` on the same model, alone on a Unix socket, under callgrind the same
  way: what one request costs the worker process (its HTTP path, validation,
  tokenization, the queue hand-off to the device thread, the forward, the answer's
  encoding). The forward of the tiny model is a small part: `/health` is counted too, as
  the floor of the worker's HTTP path.

One client sends one request at a time over a kept-alive connection: `POST
/v1/embeddings` with a body whose text is new every time (no result cache could
answer). `--baseline REV` runs the same on `git archive REV`, sides alternating.
Needs valgrind on PATH. Writes bench/results/request_instructions.json.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_revisions import export_tree, schedule
from bench.harness import ROOT, free_port, host_info, print_table, write_result

WARMUP = 50
_START_TIMEOUT_S = 1800.0  # a worker under callgrind on a busy host: minutes


def _body(model: str, number: int) -> bytes:
    return b'{"model": "%s", "input": "request number %08d"}' % (model.encode(), number)


def _request(path: bytes, body: bytes | None) -> bytes:
    if body is None:
        return b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body)
    )


def _read_answer(sock: socket.socket) -> int:
    """Read one answer (Content-Length framed) and return its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before an answer")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ", 2)[1])


class _Client:
    def __init__(self, connect, model: str) -> None:
        self.sock = connect()
        self.model = model  # the router's deployment, or the artifact a worker serves
        self.sent = 0

    def send(self, count: int, path: bytes, with_body: bool) -> None:
        for _ in range(count):
            self.sent += 1
            self.sock.sendall(_request(path, _body(self.model, self.sent) if with_body else None))
            status = _read_answer(self.sock)
            if status != 200:
                raise SystemExit(f"{path.decode()} answered {status}")


def _callgrind(out_dir: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out_dir}/cg.%p"]  # fmt: skip


def _control(pid: int, out_dir: Path, *args: str) -> None:
    """callgrind_control finds the process through vgdb's pipes, which valgrind made in the
    process's TMPDIR (`out_dir`)."""
    done = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(out_dir)}, check=True)  # fmt: skip
    if "Error" in done.stdout or "Error" in done.stderr:
        raise SystemExit(f"callgrind_control {' '.join(args)}: {done.stdout}{done.stderr}")


def _last_dump_instructions(out_dir: Path, pid: int) -> int:
    dumps = sorted(glob.glob(f"{out_dir}/cg.{pid}.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
    for line in Path(dumps[-1]).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dumps[-1]}")


def _measure(pid: int, out_dir: Path, client: _Client, requests: int, path: bytes,
             with_body: bool) -> float:  # fmt: skip
    """Instructions per request of `pid` over `requests` requests after a warm-up."""
    _control(pid, out_dir, "--instr=on")
    client.send(WARMUP, path, with_body)
    _control(pid, out_dir, "--dump")
    client.send(requests, path, with_body)
    _control(pid, out_dir, "--dump")
    _control(pid, out_dir, "--instr=off")
    return _last_dump_instructions(out_dir, pid) / requests


def _wait(check, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}: {_log_tail(proc)}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready in {_START_TIMEOUT_S:.0f} s")


def _start(argv: list[str], tree: Path, workdir: Path, name: str) -> subprocess.Popen:
    """`argv` under callgrind, its stderr in workdir/NAME.log (shown if it fails to start)."""
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen([*_callgrind(workdir), *argv], cwd=workdir,
                                env=_env(tree, workdir), stdout=subprocess.DEVNULL,
                                stderr=log)  # fmt: skip
    proc.log_path = workdir / f"{name}.log"  # type: ignore[attr-defined]
    return proc


def _log_tail(proc: subprocess.Popen) -> str:
    return proc.log_path.read_text(errors="replace")[-2000:]  # type: ignore[attr-defined]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _env(tree: Path, workdir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": str(workdir),
            "VLLM_SRUN_RESULT_CACHE": "0"}  # fmt: skip


def router_per_request(tree: Path, artifact: str, workdir: Path, requests: int) -> float:
    port = free_port()
    config = workdir / f"config-{port}.yaml"
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: {artifact}\n        replicas: [{{device: cpu}}]\n"
        f"listeners:\n  - {{host: 127.0.0.1, port: {port}}}\n"
    )
    argv = [sys.executable, "-m", "sr", "serve", "--config", str(config), "--threads", "1"]
    proc = _start(argv, tree, workdir, "router")
    try:

        def ready() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(_request(b"/ready", None))
                return _read_answer(sock) == 200

        _wait(ready, proc, "sr serve")
        client = _Client(
            lambda: socket.create_connection(("127.0.0.1", port), timeout=60), "primary"
        )
        return _measure(proc.pid, workdir, client, requests, b"/v1/embeddings", True)
    finally:
        _stop(proc)


def worker_per_request(tree: Path, artifact: str, workdir: Path, requests: int) -> dict:
    uds = str(workdir / f"worker-{time.monotonic_ns()}.sock")
    argv = [sys.executable, "-m", "sr", "worker", "--artifact", artifact, "--threads", "1",
            "--uds", uds]  # fmt: skip
    proc = _start(argv, tree, workdir, "worker")

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(60)
        sock.connect(uds)
        return sock

    try:

        def ready() -> bool:
            with connect() as sock:
                sock.sendall(_request(b"/health", None))
                return _read_answer(sock) == 200

        _wait(ready, proc, "sr worker")
        client = _Client(connect, artifact)
        return {
            "POST /v1/embeddings": _measure(
                proc.pid, workdir, client, requests, b"/v1/embeddings", True
            ),
            "GET /health": _measure(proc.pid, workdir, client, requests, b"/health", False),
        }
    finally:
        _stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a revision of this checkout to compare against")
    parser.add_argument("--runs", type=int, default=2, help="runs per side")
    parser.add_argument("--requests", type=int, default=400, help="requests counted per run")
    parser.add_argument("--only", choices=("router", "worker"), help="count one process only")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind and callgrind_control (apt-get install valgrind)")
    from sr.models.testing import write_tiny_bert

    with tempfile.TemporaryDirectory(prefix="sr-reqinstr-") as scratch_name:
        scratch = Path(scratch_name)
        artifact = str(write_tiny_bert(scratch / "tiny", seed=0))
        trees = {"candidate": ROOT}
        if args.baseline:
            trees["baseline"] = export_tree(args.baseline, scratch)
        order = schedule(args.runs) if args.baseline else ["candidate"] * args.runs
        counts: dict[str, dict[str, list[float]]] = {side: {} for side in trees}
        for number, side in enumerate(order):
            workdir = scratch / f"run-{number}"
            workdir.mkdir(mode=0o700)
            rows = {}
            if args.only != "worker":
                rows["router POST /v1/embeddings"] = router_per_request(
                    trees[side], artifact, workdir, args.requests)  # fmt: skip
            if args.only != "router":
                worker = worker_per_request(trees[side], artifact, workdir, args.requests)
                rows.update({f"worker {path}": value for path, value in worker.items()})
            for name, value in rows.items():
                counts[side].setdefault(name, []).append(value)
                print(f"{side:9s} {name:28s} {value:>12,.0f}", flush=True)
    names = list(counts["candidate"])
    table, result_rows = [], []
    for name in names:
        cells = [name] + [f"{statistics.median(counts[s][name]):,.0f}" for s in trees]
        row: dict = {"path": name, **{s: counts[s][name] for s in trees}}
        if "baseline" in trees:
            ratio = statistics.median(counts["candidate"][name]) / statistics.median(
                counts["baseline"][name]
            )
            row["ratio"] = round(ratio, 3)
            cells.append(f"{ratio:.3f}")
        table.append(cells)
        result_rows.append(row)
    header = ["instructions per request", *trees] + (["ratio"] if "baseline" in trees else [])
    print_table(header, table)
    write_result("request_instructions", {"baseline": args.baseline, "requests": args.requests,
                                          "rows": result_rows, "host": host_info()})  # fmt: skip


if __name__ == "__main__":
    main()
