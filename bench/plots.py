"""The PNG plots of docs/benchmarks.md (matplotlib, headless), from benchmark results."""

from __future__ import annotations

from bench.harness import ROOT

IMG = ROOT / "docs" / "img"


def make_plots(results: dict[str, dict | None]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}
    router = results.get("router")
    if router:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels, width = ["p50", "p90", "p99"], 0.13
        for i, row in enumerate(router["rows"]):
            for j, path in enumerate(("router", "direct")):
                values = [row[path][f"{q}_ms"] for q in labels]
                xs = [k + (i * 2 + j - 2.5) * width for k in range(len(labels))]
                ax.bar(xs, values, width, label=f"{path}, concurrency {row['concurrency']}")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yscale("log")
        ax.set_ylabel("latency, ms (log)")
        ax.set_title("through sr serve vs straight to the worker (tiny BERT)")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(IMG / "router_latency.png", dpi=110)
        plt.close(fig)
        made["router"] = "img/router_latency.png"
    scaling = results.get("scaling")
    if scaling:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        levels = [r["concurrency"] for r in scaling["rows"]]
        for n in sorted(scaling["rows"][0]["by_replicas"]):
            tput = [r["by_replicas"][n]["throughput_rps"] for r in scaling["rows"]]
            ax.plot(levels, tput, marker="o", label=f"{n} replica(s), 1 thread each")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent callers")
        ax.set_ylabel("answers / s")
        ax.set_title("throughput against replicas and concurrency (MiniLM)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(IMG / "scaling.png", dpi=110)
        plt.close(fig)
        made["scaling"] = "img/scaling.png"
    threads = results.get("threads")
    if threads:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for name, per_bucket in threads["median_served_ms"].items():
            buckets = sorted(per_bucket, key=int)
            ax.plot(
                [2 ** int(b) for b in buckets],
                [per_bucket[b] for b in buckets],
                marker="o",
                label=name,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("padded tokens in the batch (bucket start)")
        ax.set_ylabel("median served latency, ms (log)")
        ax.set_title("thread scaling (MiniLM, ForwardRunner)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(IMG / "threads.png", dpi=110)
        plt.close(fig)
        made["threads"] = "img/threads.png"
    return made
