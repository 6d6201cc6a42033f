"""bench/results/report.md and docs/img/*.png from bench/results/*.json: every result's table
as generated, for the hand-kept docs/benchmarks.md (the current results) and
docs/benchmarks-history.md (earlier reads and attempts) to be updated from."""

from __future__ import annotations

import datetime
from pathlib import Path

from bench.harness import ROOT, read_result
from bench.plots import make_plots

DOC = ROOT / "bench" / "results" / "report.md"


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


def targets(results: dict[str, dict | None]) -> list[list[object]]:
    rows: list[list[object]] = []
    router = results.get("router")
    c1 = next((r for r in router["rows"] if r["concurrency"] == 1), None) if router else None
    if c1:
        p50, p99 = c1["p50_overhead_ms"], c1["p99_overhead_ms"]
        rows.append(
            [
                "router overhead p50, concurrency 1",
                "<= 0.6 ms",
                f"{p50:.3f} ms",
                _verdict(p50 <= 0.6),
            ]
        )
        rows.append(
            ["router overhead p99, concurrency 1", "<= 2 ms", f"{p99:.3f} ms", _verdict(p99 <= 2.0)]
        )
    scaling = results.get("scaling")
    c64 = next((r for r in scaling["rows"] if r["concurrency"] == 64), None) if scaling else None
    if c64:
        rows.append(
            [
                "2 replicas vs 1 at concurrency 64 (MiniLM, 1 thread each)",
                ">= 1.7x",
                f"{c64['ratio']:.2f}x",
                _verdict(c64["ratio"] >= 1.7),
            ]
        )
    serve_st = results.get("serve_st")
    if serve_st:
        b, s = serve_st["batch32"], serve_st["single"]
        rows.append(
            [
                "32 concurrent via sr serve vs ST encode(batch_size=32)",
                ">= 0.8x",
                f"{b['ratio']:.2f}x",
                _verdict(b["ratio"] >= 0.8),
            ]
        )
        rows.append(
            [
                "single request via sr serve vs ST encode, latency",
                "<= 1.0x",
                f"{s['ratio']:.2f}x",
                _verdict(s["ratio"] <= 1.0),
            ]
        )
    dispatch = results.get("dispatch")
    if dispatch:
        case = next(c for c in dispatch["cases"] if c["replicas"] == 64 and not c["in_backoff"])
        rows.append(
            [
                "dispatch decision, 64 replicas (median; p99)",
                "< 20 us",
                f"{case['median_us']:.2f} us; {case['p99_us']:.2f} us",
                _verdict(case["p99_us"] < 20),
            ]
        )
    return rows


def _cpu_cells(summary: dict) -> list[object]:
    cpu = summary.get("cpu_us_per_answer")
    if not cpu:
        return ["", "", ""]
    return [cpu["router"], cpu["workers"], cpu["load generator"]]


def _sections(results: dict[str, dict | None], plots: dict[str, str]) -> list[str]:
    out: list[str] = []
    router = results.get("router")
    if router:
        rows = []
        for r in router["rows"]:
            for path in ("router", "direct"):
                s = r[path]
                rows.append(
                    [
                        r["concurrency"],
                        path,
                        s["p50_ms"],
                        s["p90_ms"],
                        s["p99_ms"],
                        s["throughput_rps"],
                        s["errors"],
                    ]
                )
            rows.append(
                [
                    r["concurrency"],
                    "**overhead**",
                    r["p50_overhead_ms"],
                    "",
                    r["p99_overhead_ms"],
                    f"router CPU {r['router_cpu_us_per_request']} us/request",
                    "",
                ]
            )
        out.append(
            "## Router hop (`bench_router`)\n\n`sr serve` with one tiny-BERT worker, result "
            "cache off, unique inputs; router (loopback TCP) and direct (worker's Unix "
            f"socket) alternate in {router['rounds']} rounds of {router['seconds_per_round']}"
            " s per concurrency (at concurrency 1 the two paths take turns request by request). "
            "`errors` are 503 `overloaded` answers: the router admits 32 requests per worker "
            "and turns the rest away, while the direct path queues all of them in the worker, "
            "so at concurrency 64 the two rows are not comparable as an overhead.\n\n"
            + _table(["concurrency", "path", "p50 ms", "p90 ms", "p99 ms", "req/s", "errors"], rows)
        )
        if "router" in plots:
            out.append(f"![latency percentiles]({plots['router']})\n")
    transport = results.get("transport")
    if transport:
        rows = [
            [
                name,
                c["p50_ms"],
                c["p90_ms"],
                c["p99_ms"],
                c["throughput_rps"],
                c["client_cpu_us_per_request"],
            ]
            for name, c in transport["clients"].items()
        ]
        out.append(
            "## Router-to-worker client (`bench_transport`)\n\nOne tiny-BERT worker, "
            "concurrency 1, the two clients alternate rounds.\n\n"
            + _table(
                ["client", "p50 ms", "p90 ms", "p99 ms", "req/s", "client CPU us/request"], rows
            )
        )
    frontend = results.get("frontend")
    if frontend:
        rows = [[m, v["median_us"], v["p99_us"]] for m, v in frontend["modes"].items()]
        out.append(
            "## Front end in process (`bench_frontend`)\n\n`RouterApp` with a pool that "
            "answers at once: the app's own cost per native request.\n\n"
            + _table(["mode", "median us", "p99 us"], rows)
        )
    scaling = results.get("scaling")
    if scaling:
        rows = []
        for r in scaling["rows"]:
            for n, m in r["by_replicas"].items():
                rows.append(
                    [
                        r["concurrency"],
                        n,
                        m["throughput_rps"],
                        m["p50_ms"],
                        m["p99_ms"],
                        m["errors"],
                        *_cpu_cells(m),
                    ]
                )
            rows.append([r["concurrency"], "2 vs 1", f"{r['ratio']:.2f}x", "", "", "", "", "", ""])
        out.append(
            "## Scaling (`bench_scaling`)\n\nTwo `sr serve` side by side (1 and 2 MiniLM "
            "workers, 1 thread each), alternating rounds. `turned away` = 503 answers "
            "(the caller pauses 5 ms and retries).\n\n"
            + _table(
                [
                    "concurrency",
                    "replicas",
                    "answers/s",
                    "p50 ms",
                    "p99 ms",
                    "turned away",
                    "router CPU us/answer",
                    "workers CPU us/answer",
                    "load generator CPU us/answer",
                ],
                rows,
            )
        )
        if "scaling" in plots:
            out.append(f"![throughput against replicas and concurrency]({plots['scaling']})\n")
    serve_st = results.get("serve_st")
    if serve_st:
        b, s = serve_st["batch32"], serve_st["single"]
        rows = [
            [
                "32 concurrent requests: answers/s",
                b["sr"]["requests_per_s"],
                b["st"]["requests_per_s"],
                f"{b['ratio']:.2f}x",
            ],
            [
                "32 concurrent requests: median round ms",
                b["sr"]["median_ms"],
                b["st"]["median_ms"],
                "",
            ],
            [
                "single request: median ms",
                s["sr"]["median_ms"],
                s["st"]["median_ms"],
                f"{s['ratio']:.2f}x",
            ],
            ["single request: p90 ms", s["sr"]["p90_ms"], s["st"]["p90_ms"], ""],
        ]
        out.append(
            f"## sr serve vs sentence-transformers (`bench_serve_st`)\n\nMiniLM, "
            f"{serve_st['threads']} torch thread(s) on both sides, interleaved round by "
            "round.\n\n" + _table(["measure", "sr serve", "sentence-transformers", "ratio"], rows)
        )
    engine = results.get("engine")
    if engine:
        rows = [
            ["max abs diff, 200 texts", f"{engine['max_abs_diff']:.2e}", "", ""],
            [
                "single short input, ms",
                engine["single_ms"]["sr"],
                engine["single_ms"]["sentence_transformers"],
                f"{engine['single_ms']['ratio']:.2f}x",
            ],
            [
                "batch of 32 short, ms",
                engine["batch32_ms"]["sr"],
                engine["batch32_ms"]["sentence_transformers"],
                f"{engine['batch32_ms']['ratio']:.2f}x",
            ],
        ]
        out.append(
            "## Encoder in process (`bench_engine`)\n\nsr's encoder vs "
            "sentence-transformers, one thread, alternating calls.\n\n"
            + _table(["measure", "sr", "sentence-transformers", "ratio"], rows)
        )
    onnx = results.get("onnx")
    if onnx:
        out.append(_onnx_section(onnx))
    threads = results.get("threads")
    if threads:
        medians = threads["median_served_ms"]
        names = list(medians)
        buckets = sorted(next(iter(medians.values())), key=int)
        rows = [[f"2^{b}.."] + [medians[n][b] for n in names] for b in buckets]
        out.append(
            "## Thread scaling (`bench_threads`)\n\nMedian served latency (ms) per "
            "padded-token bucket.\n\n" + _table(["bucket", *names], rows)
        )
        if "threads" in plots:
            out.append(f"![thread scaling]({plots['threads']})\n")
    worker = results.get("worker_http")
    if worker:
        rows = [
            [
                "sr worker, 32 concurrent HTTP requests (UDS)",
                worker["sr_worker_http"]["median_round_ms"],
                worker["sr_worker_http"]["requests_per_s"],
            ],
            [
                "sentence-transformers encode(batch_size=32)",
                worker["sentence_transformers_encode"]["median_round_ms"],
                worker["sentence_transformers_encode"]["requests_per_s"],
            ],
        ]
        out.append(
            f"## Worker HTTP (`bench_worker_http`)\n\nStart to ready "
            f"{worker['worker_start_to_ready_s']} s, RSS {worker['worker_rss_mib']} MiB."
            f"{_worker_http_ratio(worker)}\n\n" + _table(["path", "median round ms", "req/s"], rows)
        )
    worker_server = results.get("worker_server")
    if worker_server:
        out.append(_worker_server_section(worker_server))
    dispatch = results.get("dispatch")
    if dispatch:
        rows = [
            [c["replicas"], c["in_backoff"], c["median_us"], c["p99_us"], c["max_us"]]
            for c in dispatch["cases"]
        ]
        out.append(
            "## Dispatch decision (`bench_dispatch`)\n\n`DeploymentPolicy.reserve`, "
            "pure.\n\n" + _table(["replicas", "in backoff", "median us", "p99 us", "max us"], rows)
        )
    return out


def _onnx_section(result: dict) -> str:
    """sr (in process and through `sr serve`) against ONNX Runtime's two graphs per thread
    count, with issue 16's targets read on the ratios to the faster graph of each case."""
    names = ("sr", "sr_serve", "ort_fused", "ort_plain")
    rows: list[list[object]] = []
    for entry in result["by_threads"]:
        threads = entry["threads"]
        for case, c in entry["cases"].items():
            batch = "texts_per_s" in c["sr"]
            key, unit = ("texts_per_s", "texts/s") if batch else ("median_ms", "ms")
            ratios = "; ".join(
                f"{side}: {next(iter(c[side + '_vs_ort'].values())):.2f}x "
                f"(paired {c[side + '_vs_ort']['paired']:.2f})"
                for side in names[:2]
                if side + "_vs_ort" in c
            )
            values = [c[s][key] if s in c else "" for s in names]
            cpu = [c[s]["cpu_ms_per_text"] if s in c else "" for s in names]
            rows.append([threads, case, unit, *values, c["best_ort"], ratios])
            rows.append([threads, case, "CPU ms/text", *cpu, "", ""])
    goals = [
        [e["threads"], side, t["case"], t["goal"], f"{t['measured']:.2f}x", _verdict(t["met"])]
        for e in result["by_threads"]
        for side, side_targets in e["targets"].items()
        for t in side_targets
    ]
    agreement = "; ".join(
        f"{e['threads']} thread(s), {graph}: max abs diff {check['max_abs_diff']:.1e}, "
        f"min cosine {check['min_cosine']:.7f}"
        for e in result["by_threads"]
        for graph, check in e["agreement"].items()
    )
    header = ["threads", "case", "unit", "sr", "sr serve", "ORT fused", "ORT plain"]
    return (
        "## sr vs ONNX Runtime (`bench_onnx`)\n\nThe embedded MiniLM exported with "
        "`torch.onnx` from the same weights in the run, as ORT's BERT-fused graph and as the "
        f"plain graph (ORT {result['versions']['onnxruntime']}, CPU provider, intra-op "
        "threads = sr's torch threads, inter-op 1); sides alternate round by round; ratios "
        "are sr over the faster ORT graph of the case (throughput: higher is better for sr; "
        "latency: lower), of the medians and (paired) of adjacent runs. Same function over "
        f"200 varied texts: {agreement}.\n\n"
        + _table([*header, "faster ORT", "sr / faster ORT"], rows)
        + "\nThe engine's targets against ONNX Runtime:\n\n"
        + _table(["threads", "side", "case", "goal", "measured", "verdict"], goals)
    )


def _worker_http_ratio(worker: dict) -> str:
    # Older result files predate the interleaved run and carry no ratio.
    if "ratio" not in worker:
        return ""
    how = "sides alternated round by round" if worker.get("interleaved") else "sides in turn"
    return f" Worker / encode throughput {worker['ratio']}x ({how})."


def _worker_server_section(result: dict) -> str:
    """hypercorn and sr's h11 server serving the same worker, with the h1/hypercorn CPU ratio
    per endpoint and concurrency (the figure the server swap was decided on)."""
    by_case: dict[tuple[str, int], dict[str, dict]] = {}
    for r in result["rows"]:
        by_case.setdefault((r["endpoint"], r["concurrency"]), {})[r["server"]] = r
    rows: list[list[object]] = []
    for (endpoint, concurrency), servers in by_case.items():
        for name, r in servers.items():
            rows.append(
                [
                    endpoint,
                    concurrency,
                    name,
                    r["worker_cpu_us_per_request"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["throughput_rps"],
                ]
            )
        old, new = servers.get("hypercorn"), servers.get("h1")
        if old and new and old["worker_cpu_us_per_request"]:
            ratio = new["worker_cpu_us_per_request"] / old["worker_cpu_us_per_request"]
            rows.append([endpoint, concurrency, "**h1 / hypercorn**", f"{ratio:.2f}x", "", "", ""])
    return (
        "## Worker HTTP server (`bench_worker_server`)\n\nThe same tiny-BERT worker served "
        "by hypercorn (through a plain ASGI adapter, as before the swap) and by `sr worker` "
        "(sr.http.server), on Unix sockets, called through the router's client; the two servers "
        f"alternate in {result['rounds']} rounds. Worker CPU is the worker process's "
        "utime+stime per request.\n\n"
        + _table(
            [
                "endpoint",
                "concurrency",
                "server",
                "worker CPU us/request",
                "p50 ms",
                "p99 ms",
                "req/s",
            ],
            rows,
        )
    )


NAMES = (
    "router",
    "transport",
    "frontend",
    "scaling",
    "serve_st",
    "engine",
    "onnx",
    "threads",
    "worker_http",
    "worker_server",
    "dispatch",
)


def write_report(*, quick: bool = False) -> Path:
    results = {name: read_result(name) for name in NAMES}
    plots = make_plots(results)
    loads = sorted(
        {
            str(r["host"]["load_average_1m"])
            for r in results.values()
            if r and "host" in r and isinstance(r["host"], dict) and "load_average_1m" in r["host"]
        }
    )
    today = datetime.date.today().isoformat()
    parts = [
        "# Benchmarks\n",
        f"Generated by `python -m bench{' --quick' if quick else ''}` on {today} from "
        "`bench/results/*.json`, the tables to update docs/benchmarks.md from. Host: "
        "2 CPUs shared with other work (1-minute load averages seen during the runs: "
        f"{', '.join(loads) or 'n/a'}), so compare ratios measured in one run, not absolute "
        "numbers across runs.\n",
        "## Targets\n\n" + _table(["target", "goal", "measured", "verdict"], targets(results)),
        *_sections(results, plots),
    ]
    DOC.write_text("\n".join(parts))
    return DOC
