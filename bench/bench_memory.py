"""Memory of replicas on one host: do workers of one model share their weights' pages?

    python -m bench.bench_memory [--requests 3] [--repeats 2] [--baseline REV] [--families]
                                 [--artifact FOLDER] [--starts fork,spawn] [--kernels auto,blas]
    python -m bench.bench_memory --allocator [--rounds 4]

Starts `sr serve` with the embedded MiniLM (`sentence-transformers/all-MiniLM-L6-v2`,
resolved offline; or `--artifact`, e.g. a folder from bench.family_models) as 1 and then
2 managed CPU replicas (1 thread each), sends a few requests so that every worker has run
short, long and batched forwards, and reads each worker's memory once it is idle (3 s after
the last answer: the worker's malloc trimmer has given kept batch memory back,
sr.worker.allocator; "busy PSS" is read 0.5 s after it). Target: the 2 replicas
take at most 1.25x the memory of 1.

Two measures of "the memory of the replicas":
* the kernel's PSS (/proc/PID/smaps_rollup: Pss, with Rss, Private_Dirty, Shared_Clean),
  which charges a page shared by n processes 1/n to each. Those n count every process on
  the host, so a library or weights page that some unrelated process also maps lowers the
  figure: on a busy host it moves from run to run;
* the workers' own footprint: the distinct physical pages they map together (from
  /proc/PID/pagemap, which needs root to show page frames), split into pages one worker
  alone maps and pages two share. It is the sum of the PSS the workers would have if
  they were alone on the host, and the ratio the target is checked on.

Attribution: each worker's mapping of model.safetensors (Rss, Pss, Private_Dirty: pages a
write copied), the footprint's pages by kind (the weights file, other files such as the
libraries, anonymous memory), and, from loading the same model in a child process, the
model's tensor bytes whose storage lies in the file mapping against those in anonymous
memory (private to each process), with the largest private tensors named.

Workers started through a fork server (sr.pool.forked; `--starts` measures this
checkout with each `SR_WORKER_START` given, in turns) are children of that server, not of
the router: the servers between them and the router (the router's fork server, and the
model's that loaded the weights before forking, where there is one) are counted with them
(their pages are what the workers share; their own private pages are the price of
sharing), and their PSS is shown apart.

Restart: once memory is read, one worker is killed (SIGKILL) and the time from its
successor's start (its pid appearing in the inventory, after the restart backoff) to its
replica being ready again is its ready time.

`--allocator` compares the worker's malloc settings (sr.worker.allocator) with glibc's
defaults: a fresh process per side and round, sides alternating (default first in odd
rounds), each loading the model and running forwards of 32 medium texts in one long-lived
thread, as the worker's device thread does. Per forward: wall and CPU ms (medians), kernel
ms and minor page faults (means); anonymous MiB after the forwards and after an idle
trim (the worker's trimmer: `malloc_trim(0)`; default: nothing). Ratios are paired by
round. Writes bench/results/allocator.json.

`--families` also sorts the tensors of each family's random checkpoint (bench.family_models,
built with transformers) the same way: no servers, just where each family's weights lie.
`--baseline REV` measures the `sr` package of a commit (exported with `git archive` into
a temporary folder and run from there) beside this checkout, so the table and the JSON
show before and after from one run on one host. Writes bench/results/memory.json
(memory-<folder name>.json for another `--artifact`).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, ServeProcess, embedded_artifact, print_table, write_result

TARGET_RATIO = 1.25
IDLE_WAIT_S = 3.0  # > 2 checks of the worker's idle trimmer (sr.worker.allocator.IDLE_S)
START_ENV = "SR_WORKER_START"  # sr.pool.forked.START_ENV; a baseline tree may not have it
ROLLUP_FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")
WEIGHTS_FILE = "model.safetensors"
MIB = 1024 * 1024

# Short, medium and long texts, alone and batched: every forward shape a worker serves
# (and so every weight page) is touched before memory is read.
_WORDS = ("the", "router", "sends", "each", "text", "to", "a", "worker", "that", "embeds",
          "it", "with", "the", "model", "weights")  # fmt: skip


def _texts(count: int, words: int, tag: str) -> list[str]:
    return [f"{tag} {i} " + " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(words))
            for i in range(count)]  # fmt: skip


def smaps_rollup(pid: int) -> dict[str, int]:
    """The process's memory totals in kB (Linux /proc/PID/smaps_rollup)."""
    totals = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ROLLUP_FIELDS:
            totals[key] = int(rest.split()[0])
    return totals


def mapped_file(pid: int, suffix: str = WEIGHTS_FILE) -> dict[str, int]:
    """kB of the process's mappings of files whose path ends with `suffix` (/proc/PID/smaps):
    what of the weights file it holds, shares and has privately copied."""
    totals = dict.fromkeys(ROLLUP_FIELDS, 0) | {"mappings": 0}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            inside = len(head) >= 6 and head[-1].endswith(suffix)
            totals["mappings"] += inside
        elif inside and head and head[0].rstrip(":") in ROLLUP_FIELDS:
            totals[head[0].rstrip(":")] += int(head[1])
    return totals


PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
_FRAME = (1 << 55) - 1


def page_frames(pid: int) -> dict[int, str]:
    """Physical frame -> kind ("weights file", "other files", "anonymous") of every page the
    process has in memory (/proc/PID/pagemap; frames read as 0 without root)."""
    frames: dict[int, str] = {}
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split()
            low, high = (int(v, 16) for v in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if name == "[vsyscall]":
                continue  # outside the process's page tables
            kind = (
                "weights file" if name.endswith(WEIGHTS_FILE)
                else "other files" if name.startswith("/")
                else "anonymous"
            )  # fmt: skip
            pagemap.seek(low // PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(pagemap.read((high - low) // PAGE * 8))
            for entry in entries:
                if entry & _PRESENT:
                    frames[entry & _FRAME] = kind
    if frames and set(frames) == {0}:
        raise SystemExit("/proc/PID/pagemap shows no page frames: run as root")
    return frames


def footprint(pids: list[int]) -> dict:
    """The distinct pages the processes map together, in MiB, by kind; `shared` counts the
    pages more than one of them maps, `private_per_process` the others, per process."""
    owners: dict[int, int] = {}
    kinds: dict[int, str] = {}
    for pid in pids:
        for frame, kind in page_frames(pid).items():
            owners[frame] = owners.get(frame, 0) + 1
            kinds[frame] = kind
    total: dict[str, int] = {}
    shared: dict[str, int] = {}
    for frame, count in owners.items():
        kind = kinds[frame]
        total[kind] = total.get(kind, 0) + 1
        if count > 1:
            shared[kind] = shared.get(kind, 0) + 1

    def mib(pages: int) -> float:
        return round(pages * PAGE / MIB, 1)

    private = {kind: total[kind] - shared.get(kind, 0) for kind in total}
    return {
        "total_mib": mib(sum(total.values())),
        "by_kind_mib": {kind: mib(n) for kind, n in sorted(total.items())},
        "shared_mib": {kind: mib(n) for kind, n in sorted(shared.items())},
        "private_per_process_mib": {
            kind: round(mib(n) / len(pids), 1) for kind, n in sorted(private.items())
        },
    }


def wait_all_ready(serve: ServeProcess, replicas: int, timeout_s: float = 240.0) -> list[int]:
    """Worker pids once every replica is ready (ServeProcess waits for /ready, which one
    ready replica per deployment satisfies)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if serve.proc.poll() is not None:
            raise SystemExit(f"sr serve exited with {serve.proc.returncode}")
        try:
            inventory = httpx.get(serve.url + "/api/v1/inventory/model-runtime", timeout=5).json()
            rows = inventory["deployments"]["primary"]["replicas"]
            if len(rows) == replicas and all(r["state"] == "ready" for r in rows):
                return [r["pid"] for r in rows]
        except (httpx.TransportError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    raise SystemExit(f"sr serve: {replicas} replicas not ready in {timeout_s:.0f} s")


def touch(url: str, replicas: int, requests: int) -> None:
    """Short, medium and long texts, alone and in batches of 32, `requests` times on every
    replica: each request goes `replicas` times in a row, and the pool gives back-to-back
    requests to its idle workers in turn (least recently assigned)."""
    import httpx

    with httpx.Client(base_url=url, timeout=60) as client:
        for round_ in range(requests):
            for count, words in ((1, 4), (1, 100), (32, 30), (4, 200)):
                for replica in range(replicas):
                    texts = _texts(count, words, f"r{round_}.{replica}")
                    answer = client.post(
                        "/v1/embeddings", json={"model": "primary", "input": texts}
                    )
                    if answer.status_code != 200:
                        raise SystemExit(f"/v1/embeddings answered {answer.status_code}")


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def servers_between(pids: list[int], router: int) -> list[int]:
    """The processes between the workers and the router: fork servers."""
    found: set[int] = set()
    for pid in pids:
        parent = parent_pid(pid)
        while parent not in (router, 0, 1) and parent not in found:
            found.add(parent)
            parent = parent_pid(parent)
    return sorted(found)


def restart_ready_s(serve: ServeProcess, timeout_s: float = 240.0) -> float:
    """SIGKILL the first replica's worker; seconds from its successor's start to ready."""
    import httpx

    def first_row() -> dict:
        url = serve.url + "/api/v1/inventory/model-runtime"
        return httpx.get(url, timeout=5).json()["deployments"]["primary"]["replicas"][0]

    victim = first_row()["pid"]
    os.kill(victim, signal.SIGKILL)
    started = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = first_row()
        if row["pid"] not in (None, victim):
            started = started or time.monotonic()
            if row["state"] == "ready":
                return round(time.monotonic() - started, 2)
        time.sleep(0.05)
    raise SystemExit(f"sr serve: a killed worker's replica not ready in {timeout_s:.0f} s")


def measure(
    tree: Path,
    artifact: str,
    replicas: int,
    requests: int,
    start: str | None,
    kernel: str | None = None,
) -> dict:
    """One `sr serve` with `replicas` workers; `start`: its SR_WORKER_START (None: unset);
    `kernel`: the deployment's kernel (None: the host's choice)."""
    saved = os.environ.pop(START_ENV, None)
    if start is not None:
        os.environ[START_ENV] = start  # ServeProcess passes our environment on
    try:
        with tempfile.TemporaryDirectory(prefix="sr-bench-memory-") as tmp:
            serve = ServeProcess(
                artifact, Path(tmp), replicas=replicas, pythonpath=str(tree), kernel=kernel
            )
            try:
                pids = wait_all_ready(serve, replicas)
                touch(serve.url, replicas, requests)
                time.sleep(0.5)  # let the answers' buffers go back before reading
                busy = {pid: smaps_rollup(pid) for pid in pids}
                # a worker gives kept batch memory back once idle (sr.worker.allocator)
                time.sleep(IDLE_WAIT_S)
                workers = [
                    {
                        "pid": pid,
                        "rollup_kb": smaps_rollup(pid),
                        "busy_rollup_kb": busy[pid],
                        "weights_file_kb": mapped_file(pid),
                    }
                    for pid in pids
                ]
                helpers = servers_between(pids, serve.proc.pid)
                together = footprint(pids + helpers)
                helpers_pss = sum(smaps_rollup(pid)["Pss"] for pid in helpers)
                router = smaps_rollup(serve.proc.pid)
                restart_s = restart_ready_s(serve)
            finally:
                serve.stop()
    finally:
        os.environ.pop(START_ENV, None)
        if saved is not None:
            os.environ[START_ENV] = saved
    workers_pss = sum(w["rollup_kb"]["Pss"] for w in workers) + helpers_pss
    return {
        "replicas": replicas,
        "workers": workers,
        "fork_servers": len(helpers),
        "footprint": together,
        "workers_pss_mib": round(workers_pss / 1024, 1),
        "workers_busy_pss_mib": round(
            (sum(w["busy_rollup_kb"]["Pss"] for w in workers) + helpers_pss) / 1024, 1
        ),
        "fork_server_pss_mib": round(helpers_pss / 1024, 1),
        "router_pss_mib": round(router["Pss"] / 1024, 1),
        "restart_ready_s": restart_s,
    }


def _tensors(root) -> dict[str, object]:
    """Every torch tensor reachable from `root` through attributes, slots, lists, tuples
    and dicts, by dotted path (first path found), without repeats."""
    import torch

    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(value, path: str) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found[path] = value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}")
        elif type(value).__module__.startswith("sr."):  # the model's own objects
            names = list(getattr(value, "__dict__", {}))
            for cls in type(value).__mro__:
                names += [n for n in getattr(cls, "__slots__", ()) if hasattr(value, n)]
            for name in names:
                walk(getattr(value, name), f"{path}.{name}" if path else name)

    walk(root, "")
    return found


def weight_residency(artifact: str, kernel: str | None = None) -> dict:
    """Load the model here (on `kernel`, when given) and sort its tensors' bytes by where
    their storage lies: in a mapping of a model.safetensors file, or anywhere else
    (anonymous, private)."""
    from sr.models import load_model, resolve_artifact

    extra = {} if kernel is None else {"kernel": kernel}  # a baseline may predate kernels
    model = load_model(resolve_artifact(artifact), **extra)
    maps = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(v, 16) for v in fields[0].split("-"))
        maps.append((low, high, fields[1], fields[5] if len(fields) > 5 else ""))

    def backing(address: int) -> tuple[str, str]:
        for low, high, permissions, name in maps:
            if low <= address < high:
                return ("file" if name.endswith(WEIGHTS_FILE) else "anonymous"), permissions
        return "anonymous", ""

    file_bytes = private_bytes = 0
    private: list[tuple[int, str]] = []
    permissions = set()
    for path, tensor in _tensors(model).items():
        size = tensor.numel() * tensor.element_size()
        try:
            kind, perms = backing(tensor.data_ptr())
        except RuntimeError:  # no storage of its own (e.g. an opaque oneDNN-packed weight)
            kind, perms = "anonymous", ""
        if kind == "file":
            file_bytes += size
            permissions.add(perms)
        else:
            private_bytes += size
            private.append((size, path))
    private.sort(reverse=True)
    return {
        "file_backed_mib": round(file_bytes / MIB, 2),
        "private_mib": round(private_bytes / MIB, 2),
        "file_mapping_permissions": sorted(permissions),
        "largest_private": [{"tensor": p, "mib": round(s / MIB, 3)} for s, p in private[:8]],
    }


def residency_of(tree: Path, artifact: str, kernel: str | None = None) -> dict:
    """weight_residency in a child process running the `sr` under `tree` (its working
    directory: `python -m` puts that first on sys.path, before PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    argv = [sys.executable, "-m", "bench.bench_memory", "--residency-of", artifact]
    if kernel is not None:
        argv += ["--residency-kernel", kernel]
    out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def family_models(root: Path) -> dict[str, Path]:
    """Each family's random checkpoint at its benchmark depth (bench.family_models)."""
    from bench.family_models import FAMILIES, cached_family, quiet_transformers

    quiet_transformers()
    return {name: cached_family(name, root) for name in FAMILIES}


def export_tree(rev: str, into: Path) -> Path:
    """The `sr` package of commit `rev`, unpacked under `into` (read-only use of git)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "sr"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_tree(
    label: str,
    tree: Path,
    artifact: str,
    requests: int,
    repeats: int,
    families: dict[str, Path],
    start: str | None = None,
    kernel: str | None = None,
) -> dict:
    """1 and 2 replicas `repeats` times each, in turns (1, 2, 2, 1, ...): per-process heap
    use moves by 10-20 MiB from one start to the next, so the summary is their mean."""
    runs = []
    for repeat in range(repeats):
        for replicas in (1, 2) if repeat % 2 == 0 else (2, 1):
            run = measure(tree, artifact, replicas, requests, start, kernel)
            runs.append(run | {"repeat": repeat})
    summary = {str(n): _mean_of([r for r in runs if r["replicas"] == n]) for n in (1, 2)}
    return {
        "label": label,
        "runs": runs,
        "mean": summary,
        "footprint_ratio_2_to_1": round(summary["2"]["total_mib"] / summary["1"]["total_mib"], 3),
        "kernel_pss_ratio_2_to_1": round(
            summary["2"]["workers_pss_mib"] / summary["1"]["workers_pss_mib"], 3
        ),
        "tensors": residency_of(tree, artifact, kernel),
        "families": {name: residency_of(tree, str(folder)) for name, folder in families.items()},
    }


def _mean_of(runs: list[dict]) -> dict:
    """Mean footprint (total, and by kind: total, shared, private per worker) and kernel
    PSS of the runs of one replica count."""

    def mean(values) -> float:
        values = list(values)
        return round(sum(values) / len(values), 1)

    kinds = sorted({k for r in runs for k in r["footprint"]["by_kind_mib"]})
    return {
        "total_mib": mean(r["footprint"]["total_mib"] for r in runs),
        "workers_pss_mib": mean(r["workers_pss_mib"] for r in runs),
        "fork_server_pss_mib": mean(r.get("fork_server_pss_mib", 0.0) for r in runs),
        "workers_busy_pss_mib": mean(r.get("workers_busy_pss_mib", 0.0) for r in runs),
        "restart_ready_s": mean(r["restart_ready_s"] for r in runs),
        "by_kind_mib": {
            kind: {
                field: mean(r["footprint"][key].get(kind, 0.0) for r in runs)
                for field, key in (
                    ("total", "by_kind_mib"),
                    ("shared", "shared_mib"),
                    ("private_per_worker", "private_per_process_mib"),
                )
            }
            for kind in kinds
        },
    }


def report(results: list[dict]) -> None:
    table = []
    for result in results:
        for run in result["runs"]:
            for worker in run["workers"]:
                rollup, weights = worker["rollup_kb"], worker["weights_file_kb"]
                table.append(
                    (result["label"], run["replicas"], run["repeat"], worker["pid"],
                     _mib(rollup["Pss"]), _mib(rollup["Rss"]), _mib(rollup["Private_Dirty"]),
                     _mib(rollup["Shared_Clean"]), _mib(weights["Rss"]),
                     _mib(weights["Private_Dirty"]))
                )  # fmt: skip
    print("Per worker, kernel figures (MiB):")
    print_table(
        ("code", "replicas", "repeat", "worker", "PSS", "RSS", "private dirty", "shared clean",
         "weights file RSS", "weights file dirty"),
        table,
    )  # fmt: skip
    table = [
        (result["label"], n, kind, f["total"], f["shared"], f["private_per_worker"])
        for result in results
        for n, summary in result["mean"].items()
        for kind, f in summary["by_kind_mib"].items()
    ]
    print("\nThe workers' footprint, distinct pages by kind (MiB, mean of the repeats):")
    print_table(("code", "replicas", "kind", "total", "shared", "private per worker"), table)
    print("\nSummary (MiB, means; fork servers counted with their workers; target: 2 replicas")
    print("at most 1.25x one):")
    print_table(
        ("code", "footprint 1", "footprint 2", "ratio", "kernel PSS 1", "kernel PSS 2",
         "ratio", "busy PSS 1", "busy PSS 2", "fork servers PSS 2", "tensors in file MiB",
         "private tensors MiB", "restart ready s"),
        [(r["label"], r["mean"]["1"]["total_mib"], r["mean"]["2"]["total_mib"],
          r["footprint_ratio_2_to_1"], r["mean"]["1"]["workers_pss_mib"],
          r["mean"]["2"]["workers_pss_mib"], r["kernel_pss_ratio_2_to_1"],
          r["mean"]["1"]["workers_busy_pss_mib"], r["mean"]["2"]["workers_busy_pss_mib"],
          r["mean"]["2"]["fork_server_pss_mib"],
          r["tensors"]["file_backed_mib"], r["tensors"]["private_mib"],
          r["mean"]["2"]["restart_ready_s"]) for r in results],
    )  # fmt: skip
    for r in results:
        named = ", ".join(f"{t['tensor']} {t['mib']}" for t in r["tensors"]["largest_private"])
        print(f"{r['label']}: largest private tensors (MiB): {named}")
    if any(r["families"] for r in results):
        print("\nEach family's random model (bench.family_models depth), tensors (MiB):")
        print_table(
            ("code", "family", "in file", "private", "largest private"),
            [(r["label"], name, t["file_backed_mib"], t["private_mib"],
              ", ".join(f"{p['tensor']} {p['mib']}" for p in t["largest_private"][:2]))
             for r in results for name, t in r["families"].items()],
        )  # fmt: skip


ALLOCATOR_SIDES = ("default", "tuned")


def allocator_side(side: str, artifact: str, forwards: int = 4) -> dict:
    """One side of `--allocator`, in this (fresh) process."""
    import ctypes
    import resource
    import statistics
    import threading

    import torch

    from bench.bench_profile import case_texts
    from sr.models import load_model, resolve_artifact
    from sr.worker import allocator

    libc = allocator.glibc()
    if side == "tuned":
        assert allocator.tune_malloc(libc) == "tuned"
    torch.set_num_threads(1)
    model = load_model(resolve_artifact(artifact))
    batch = model.tokenize(case_texts(model.tokenizer, "medium", 32))
    out: dict = {"side": side, "anon_loaded_mib": _anon_mib()}

    def device_thread() -> None:
        reference = model.embed(batch)  # the first forward faults in either case
        walls, cpus = [], []
        start = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(forwards):
            wall, cpu = time.perf_counter(), time.process_time()
            answer = model.embed(batch)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            assert torch.equal(answer, reference)  # bit-neutral
        end = resource.getrusage(resource.RUSAGE_SELF)
        out["wall_ms"] = round(statistics.median(walls) * 1e3, 1)
        out["cpu_ms"] = round(statistics.median(cpus) * 1e3, 1)
        out["kernel_ms"] = round((end.ru_stime - start.ru_stime) / forwards * 1e3, 1)
        out["faults"] = round((end.ru_minflt - start.ru_minflt) / forwards)

    thread = threading.Thread(target=device_thread)
    thread.start()
    thread.join()
    out["anon_after_mib"] = _anon_mib()
    if side == "tuned":
        libc.malloc_trim(ctypes.c_size_t(0))
    out["anon_idle_mib"] = _anon_mib()
    return out


def _anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def compare_allocators(artifact: str, rounds: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    runs = []
    for round_ in range(rounds):
        sides = ALLOCATOR_SIDES if round_ % 2 == 0 else ALLOCATOR_SIDES[::-1]
        for side in sides:
            argv = [sys.executable, "-m", "bench.bench_memory", "--allocator-side", side]
            argv += ["--artifact", artifact]
            done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"allocator side {side} failed: {done.stderr[-2000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]) | {"round": round_})
    paired = {
        key: [
            round(d[key] / t[key], 3)
            for d, t in (
                (
                    next(r for r in runs if r["round"] == i and r["side"] == "default"),
                    next(r for r in runs if r["round"] == i and r["side"] == "tuned"),
                )
                for i in range(rounds)
            )
        ]
        for key in ("wall_ms", "cpu_ms")
    }
    print("Allocator, 32 medium texts per forward, 1 thread (one row per process):")
    fields = ("wall_ms", "cpu_ms", "kernel_ms", "faults", "anon_loaded_mib", "anon_after_mib")
    print_table(
        ("round", "side", *fields, "anon_idle_mib"),
        [(r["round"], r["side"], *(r[f] for f in fields), r["anon_idle_mib"]) for r in runs],
    )
    for key, ratios in paired.items():
        print(f"default / tuned {key}, paired by round: {ratios}")
    result = {"benchmark": "allocator", "artifact": artifact, "runs": runs, "paired": paired}
    write_result("allocator", result)
    return result


def _mib(kb: int) -> float:
    return round(kb / 1024, 1)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3, help="rounds of touching requests")
    parser.add_argument("--repeats", type=int, default=2, help="starts of each replica count")
    parser.add_argument("--baseline", metavar="REV", help="also measure the sr of this commit")
    parser.add_argument(
        "--artifact", default=embedded_artifact(), help="the model served (default: MiniLM)"
    )
    parser.add_argument(
        "--families",
        action="store_true",
        help="also sort the tensors of each family's random model (bench.family_models)",
    )
    parser.add_argument(
        "--starts",
        default="fork,spawn",
        help=f"this checkout's worker starts to measure ({START_ENV} values, comma-separated)",
    )
    parser.add_argument(
        "--allocator", action="store_true", help="compare malloc settings (sr.worker.allocator)"
    )
    parser.add_argument(
        "--kernels",
        default="auto",
        help="the deployment kernels to measure (auto, blas, onednn; "
        "comma-separated): oneDNN packs weights at load, shared where the model's fork server "
        "packed them before forking; BLAS multiplies the file's pages",
    )
    parser.add_argument("--rounds", type=int, default=4, help="--allocator: rounds of sides")
    parser.add_argument("--residency-of", metavar="ARTIFACT", help=argparse.SUPPRESS)
    parser.add_argument("--residency-kernel", help=argparse.SUPPRESS)
    parser.add_argument("--allocator-side", choices=ALLOCATOR_SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.residency_of:
        print(json.dumps(weight_residency(args.residency_of, args.residency_kernel)))
        return None
    if args.allocator_side:
        print(json.dumps(allocator_side(args.allocator_side, args.artifact)))
        return None
    if args.allocator:
        return compare_allocators(args.artifact, args.rounds)
    results = []
    with tempfile.TemporaryDirectory(prefix="sr-bench-memory-") as tmp:
        families = family_models(Path(tmp) / "families") if args.families else {}
        if args.baseline:  # at its default worker start, with each kernel
            tree = export_tree(args.baseline, Path(tmp) / "baseline")
            for kernel in args.kernels.split(","):
                label = f"baseline {args.baseline}, kernel {kernel}"
                results.append(
                    run_tree(
                        label, tree, args.artifact, args.requests, args.repeats, families,
                        kernel=None if kernel == "auto" else kernel,
                    )
                )  # fmt: skip
        for start in args.starts.split(","):
            for kernel in args.kernels.split(","):
                label = f"this checkout, {start}, kernel {kernel}"
                results.append(
                    run_tree(
                        label,
                        ROOT,
                        args.artifact,
                        args.requests,
                        args.repeats,
                        families,
                        start,
                        None if kernel == "auto" else kernel,
                    )
                )
    report(results)
    result = {
        "benchmark": "memory",
        "artifact": args.artifact,
        "threads": 1,
        "requests": args.requests,
        "repeats": args.repeats,
        "starts": args.starts.split(","),
        "kernels": args.kernels.split(","),
        "target_ratio": TARGET_RATIO,
        "results": results,
    }
    default = args.artifact == embedded_artifact()
    write_result("memory" if default else f"memory-{Path(args.artifact).name}", result)
    return result


if __name__ == "__main__":
    main()
