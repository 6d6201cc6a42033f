"""Instructions per request, stage by stage: where the router's and a worker's counts go.

    python -m bench.bench_stage_instructions [--baseline REV]

bench/bench_request_instructions.py counts the two processes one request crosses, whole.
This splits those counts: each stage's own code runs in a loop in one process under
valgrind's callgrind, twice (SHORT and LONG passes after the same set-up and warm-up), and
the difference over LONG - SHORT is what the stage costs once. The stages are sr's real
code on the same request (`POST /v1/embeddings`, one short new text, the tiny BERT of
bench_request_instructions), without sockets:

router
* http: the request parsed and its answer framed (sr.http.connection.ServerConnection);
* front: the ASGI app with a pool that answers at once: headers, request id, Host and
  content-type checks, body, JSON parse, the deployment, metrics, the worker's timing
  read, the answer handed to the server (sr.router.app);
* dispatch: admission and the replica's choice, reserved and released (sr.pool.policy);
* hop: the request's bytes to the worker and the parse of the worker's answer head
  (sr.http.client).

worker
* http: as the router's, on the request the router sends;
* handler: the whole handler in process (WorkerService.handle): validation, tokenization,
  the hand-off to the device thread and back, the forward, the answer's encoding; split
  below into
* tokenize: the tokenizer on the text (the model's `tokenize`);
* forward: the model on the one row, on this thread at the worker's thread count (through
  its runner, as the engine runs it), to a list of floats;
* encode: the answer object to JSON bytes;
* and what the handler spends besides those three (validation, the hand-off, timing).

With bench/results/request_instructions.json at hand (bench_request_instructions, run
first), each process's count less its stages is shown as `the rest`: Trio's scheduling,
socket reads and writes, the ASGI adapter, the pool's dispatch coroutine and transport for
the router; the driver loop and socket I/O for a worker. `--baseline REV` counts the same
on `git archive REV` where that tree has the stage's code, sides alternating.

Needs valgrind on PATH. Writes bench/results/stage_instructions.json.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.bench_revisions import export_tree
from bench.harness import RESULTS, ROOT, host_info, print_table, write_result

SHORT, LONG = 200, 1200
WARMUP = 100
_TEXT = "request number %08d"


def _request_body(model: str, number: int) -> bytes:
    return b'{"model": "%s", "input": "%s"}' % (model.encode(), (_TEXT % number).encode())


def _wire(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (extra, len(body), body)
    )


# -- the stages: each returns a function that runs it once for request `number` ----------------


def _http(caller_extra: bytes) -> Callable[[int], None]:
    from sr.http.connection import ServerConnection

    http = ServerConnection(16 * 1024, 4 * 1024 * 1024)
    answer = b'{"object":"list","data":[]}'
    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"abc")]

    def once(number: int) -> None:
        http.receive_data(_wire(_request_body("primary", number), caller_extra))
        http.next_event()  # the head
        http.take_complete_body()
        http.answer(200, headers, answer)
        http.start_next_cycle()

    return once


def router_http() -> Callable[[int], None]:
    return _http(b"")


def worker_http() -> Callable[[int], None]:
    return _http(b"x-request-id: 0123456789abcdef\r\nx-sr-deployment: primary\r\n")


def router_front() -> Callable[[int], Awaitable[None]]:
    import trio

    from bench.bench_frontend import make_app, served_extensions

    app = make_app()
    extensions = served_extensions()  # as sr's server serves the app: the hang-up watch
    scope_headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]

    async def send(message: dict) -> None:
        return None

    async def once(number: int) -> None:
        body = _request_body("primary", number)
        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "query_string": b"",
                 "headers": [*scope_headers, (b"content-length", b"%d" % len(body))],
                 "extensions": extensions}  # fmt: skip
        delivered = []

        async def receive() -> dict:
            if not delivered:
                delivered.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await trio.sleep_forever()
            raise AssertionError

        await app(scope, receive, send)

    return once


def router_dispatch() -> Callable[[int], None]:
    import itertools

    from sr.config.schema import OutlierDetection
    from sr.pool.outcome import Outcome
    from sr.pool.policy import DeploymentPolicy
    from sr.pool.record import ReplicaRecord
    from sr.pool.state import ReplicaState

    sequence = itertools.count(1)
    policy = DeploymentPolicy(
        "primary", next_sequence=lambda: next(sequence), outlier=OutlierDetection()
    )
    record = ReplicaRecord(replica_id="primary-0", deployment="primary", placement="cpu")
    policy.publish([record], policy.outlier)
    policy.set_lifecycle(record, ReplicaState.READY, 0.0)

    def once(number: int) -> None:
        now = number * 0.001
        reservation = policy.reserve(48, now)
        policy.release(reservation, Outcome.OK, now + 0.0005)

    return once


def router_hop() -> Callable[[int], None]:
    from sr.http.client import Http1Pool, parse_head
    from sr.http.hop import Hop

    pool = Http1Pool(uds="/nonexistent")
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1234\r\n"
        b"x-request-id: 0123456789abcdef\r\nx-sr-timing: 5000 200 10 4500 7 24"
    )

    def once(number: int) -> None:
        # the bytes the hop writes, without a socket
        pool._request_bytes(
            "POST", "/v1/embeddings", _request_body("primary", number),
            Hop("0123456789abcdef", "primary", None),
        )  # fmt: skip
        parse_head(head)

    return once


def _worker_service(artifact: str):
    """A ready WorkerService, as `sr worker` starts it, on a Trio loop that `_run_on` keeps
    turning."""
    from sr.worker.options import WorkerOptions
    from sr.worker.service import WorkerService

    service = WorkerService(WorkerOptions(artifact=artifact, threads=1))
    _start_on_loop(service)
    if service.state.value != "ready":
        raise SystemExit(f"the worker is {service.state.value}: {service.reason}")
    return service


def worker_handler(artifact: str) -> Callable[[int], Awaitable[None]]:
    service = _worker_service(artifact)

    async def once(number: int) -> None:
        body = _request_body(artifact, number)
        status, _, payload = await service.handle("POST", "/v1/embeddings", body)
        assert status == 200, payload

    return once


def worker_tokenize(artifact: str) -> Callable[[int], None]:
    service = _worker_service(artifact)

    def once(number: int) -> None:
        service.model.tokenize([_TEXT % number])

    return once


def worker_forward(artifact: str) -> Callable[[int], None]:
    import torch

    service = _worker_service(artifact)
    model, runner = service.model, service.runner
    rows = [model.tokenize([_TEXT % n])[0] for n in range(LONG + WARMUP)]

    def once(number: int) -> None:
        # Through the worker's runner, as the engine runs it: at the worker's thread count
        # (torch's count is per calling thread; this one would run at the host's default),
        # so the cut-off padding and the kernels are the worker's.
        row = rows[number]
        with torch.inference_mode():
            out = runner.run(lambda: model.embed([row]), len(row))
            out.detach().float().cpu().tolist()

    return once


def worker_encode(artifact: str) -> Callable[[int], None]:
    from sr.worker.service import _dumps

    service = _worker_service(artifact)
    _, _, payload = _run_on(service.handle("POST", "/v1/embeddings", _request_body(artifact, 0)))
    answer = json.loads(payload)

    def once(number: int) -> None:
        _dumps(answer).encode()

    return once


# -- one Trio loop, kept in a thread, that the stages' coroutines run on ----------------------
_LOOP: dict = {}


def _start_on_loop(service) -> None:
    """Run `service` on a Trio loop in a thread of its own until the process exits."""
    import threading

    import trio

    ready = threading.Event()

    async def main() -> None:
        _LOOP["token"] = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.wait_settled()
            ready.set()
            await trio.sleep_forever()

    threading.Thread(target=trio.run, args=(main,), daemon=True).start()
    ready.wait()


def _run_on(coroutine):
    """Await `coroutine` on the kept loop (started on first use)."""
    import trio

    if "token" not in _LOOP:
        _start_on_loop(_Idle())

    async def wrapped():
        return await coroutine

    return trio.from_thread.run(wrapped, trio_token=_LOOP["token"])


class _Idle:
    """A stand-in service for a loop that only runs the stages' coroutines."""

    async def run(self, *, task_status) -> None:
        import trio

        task_status.started()
        await trio.sleep_forever()

    async def wait_settled(self) -> None:
        return None


STAGES: dict[str, tuple[str, str]] = {
    # name: (process, what it is)
    "router_http": ("router", "http: request parse and answer framing"),
    "router_front": ("router", "front: the ASGI app (pool answering at once)"),
    "router_dispatch": ("router", "dispatch: admission and choice, reserve and release"),
    "router_hop": ("router", "hop: request bytes and the answer head's parse"),
    "worker_http": ("worker", "http: request parse and answer framing"),
    "worker_handler": ("worker", "handler, whole (in process)"),
    "worker_tokenize": ("worker", "  tokenize"),
    "worker_forward": ("worker", "  forward (tiny BERT, one row)"),
    "worker_encode": ("worker", "  answer encoding"),
}
_NEEDS_ARTIFACT = {"worker_handler", "worker_tokenize", "worker_forward", "worker_encode"}


def _run_stage(name: str, count: int, artifact: str) -> None:
    """The traced process: set up, warm up, then `count` runs of the stage (an async stage
    runs all of them in one call on the Trio loop, so no crossing between threads is
    counted)."""
    make = globals()[name]
    once = make(artifact) if name in _NEEDS_ARTIFACT else make()
    if not inspect.iscoroutinefunction(once):
        for number in range(WARMUP + count):
            once(number)
        return

    async def runs(first: int, last: int) -> None:
        for number in range(first, last):
            await once(number)

    _run_on(runs(0, WARMUP))
    _run_on(runs(WARMUP, WARMUP + count))


def _instructions(tree: Path, name: str, count: int, artifact: str) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-m", "bench.bench_stage_instructions",
               "--run", name, str(count), artifact]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}", "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise StageFailed(done.stderr[-1500:])
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise StageFailed(f"no callgrind summary in:\n{done.stderr[-1500:]}")


class StageFailed(Exception):
    pass


def per_request(tree: Path, name: str, artifact: str) -> float | None:
    """The stage's instructions once; None where `tree` lacks its code."""
    try:
        long = _instructions(tree, name, LONG, artifact)
        short = _instructions(tree, name, SHORT, artifact)
    except StageFailed as error:
        print(f"{name}: not counted on {tree}: {str(error).strip().splitlines()[-1]}")
        return None
    return (long - short) / (LONG - SHORT)


def _whole_counts() -> dict[str, float] | None:
    """The candidate's whole-process counts from bench_request_instructions, if run."""
    path = RESULTS / "request_instructions.json"
    if not path.exists():
        return None
    rows = {row["path"]: row["candidate"] for row in json.loads(path.read_text())["rows"]}
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    return {
        "router": median(rows["router POST /v1/embeddings"]),
        "worker": median(rows["worker POST /v1/embeddings"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a revision of this checkout to compare against")
    parser.add_argument("--only", nargs="*", choices=sorted(STAGES), help="these stages only")
    parser.add_argument("--run", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run_stage(args.run[0], int(args.run[1]), args.run[2])
        os._exit(0)  # the kept loop's thread and the worker's device thread need no join
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_stage_instructions needs valgrind (apt-get install valgrind)")
    from sr.models.testing import write_tiny_bert

    names = args.only or list(STAGES)
    with tempfile.TemporaryDirectory(prefix="sr-stage-instr-") as scratch_name:
        scratch = Path(scratch_name)
        artifact = str(write_tiny_bert(scratch / "tiny", seed=0))
        trees = {"candidate": ROOT}
        if args.baseline:
            trees["baseline"] = export_tree(args.baseline, scratch)
        counts: dict[str, dict[str, float | None]] = {side: {} for side in trees}
        for number, name in enumerate(names):
            sides = list(trees) if number % 2 == 0 else list(reversed(trees))
            for side in sides:
                counts[side][name] = per_request(trees[side], name, artifact)
                value = counts[side][name]
                shown = "-" if value is None else f"{value:,.0f}"
                print(f"{side:9s} {name:18s} {shown:>12s}", flush=True)
    whole = _whole_counts()
    table, rows = [], []
    for name in names:
        process, what = STAGES[name]
        cells = [process, what] + [
            "-" if counts[s][name] is None else f"{counts[s][name]:,.0f}" for s in trees
        ]
        table.append(cells)
        rows.append({"stage": name, "process": process, **{s: counts[s][name] for s in trees}})
    if whole is not None and set(STAGES) <= set(names):
        candidate = counts["candidate"]
        inner = {
            "router": sum(candidate[n] or 0 for n in names if STAGES[n][0] == "router"),
            "worker": (candidate["worker_http"] or 0) + (candidate["worker_handler"] or 0),
        }
        handler_rest = (candidate["worker_handler"] or 0) - sum(
            candidate[n] or 0 for n in ("worker_tokenize", "worker_forward", "worker_encode")
        )
        table.append(["worker", "  validation, hand-off, timing (handler less the three)",
                      f"{handler_rest:,.0f}"] + [""] * (len(trees) - 1))  # fmt: skip
        for process in ("router", "worker"):
            rest = whole[process] - inner[process]
            table.append([process, "the rest: event loop, sockets, glue", f"{rest:,.0f}"]
                         + [""] * (len(trees) - 1))  # fmt: skip
            table.append([process, "whole process (bench_request_instructions)",
                          f"{whole[process]:,.0f}"] + [""] * (len(trees) - 1))  # fmt: skip
            rows.append({"stage": f"{process}_rest", "process": process, "candidate": rest})
    print_table(["process", "stage", *trees], table)
    write_result(
        "stage_instructions",
        {"baseline": args.baseline, "passes": [SHORT, LONG], "rows": rows, "whole": whole,
         "host": host_info()},
    )  # fmt: skip


if __name__ == "__main__":
    main()
