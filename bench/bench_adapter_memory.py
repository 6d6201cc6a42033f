"""Memory of LoRA adapter workers of one base on one host, against plain workers of the base.

    python -m bench.bench_adapter_memory [--base FOLDER] [--kernels auto,blas] [--requests 3]
                                         [--repeats 1]

Four `sr serve` runs, each with two CPU workers (1 thread) of one base (default: the
embedded MiniLM, resolved offline) and the adapters this script writes for it (random
LoRA, r=8 on query and value; r=16 on query, key, value and the attention output: the
`adapter_config.json` / `adapter_model.safetensors` layout peft saves):

* `base x2`: one deployment of the base, 2 replicas (forked from the deployment's fork
  server, which loaded the weights once);
* `2 base deployments`: two deployments of the base, 1 replica each;
* `adapter x2`: one adapter deployment, 2 replicas;
* `2 adapters`: two deployments, one adapter each, of the same base, 1 replica each.

Every worker answers short, long and batched /v1/embeddings requests, then its memory is
read once idle (as bench.bench_memory reads it): the kernel's PSS (/proc/PID/smaps_rollup)
of the workers and of the fork servers between them and the router (the pages they share
are the servers' pages), the workers' mapping of the base's model.safetensors, and their
footprint: the distinct physical pages the workers and servers map together
(/proc/PID/pagemap, as root), split into pages shared by two or more and private ones.

What to expect: sr merges an adapter into the base's weights at load (sr.models.adapter),
so the merged tensors are new, private pages of the process that merged them (the
deployment's fork server: its replicas share them copy-on-write), and every other tensor
is whatever the family makes of the base's file (a view of its pages on BLAS, shared by
every process that maps the file; a packed private copy on oneDNN). Writes
bench/results/adapter_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_memory import (
    IDLE_WAIT_S,
    _texts,
    footprint,
    mapped_file,
    servers_between,
    smaps_rollup,
)
from bench.harness import ROOT, embedded_artifact, free_port, print_table, write_result

ADAPTERS = {  # name -> (r, alpha, target module suffixes)
    "qv-r8": (8, 16, ("attention.self.query", "attention.self.value")),
    "qkvo-r16": (16, 32, ("attention.self.query", "attention.self.key",
                          "attention.self.value", "attention.output.dense")),
}  # fmt: skip
SCENARIOS = {  # name -> {deployment: (artifact key, replicas)}
    "base x2": {"base": ("base", 2)},
    "2 base deployments": {"base-a": ("base", 1), "base-b": ("base", 1)},
    "adapter x2": {"qv": ("qv-r8", 2)},
    "2 adapters": {"qv": ("qv-r8", 1), "qkvo": ("qkvo-r16", 1)},
}
MIB = 1024


def write_adapter(base: Path, folder: Path, r: int, alpha: int, targets, seed: int) -> Path:
    """A random LoRA adapter of `base` in peft's layout (the base's own tensor names)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    with safe_open(str(base / "model.safetensors"), "pt") as weights:
        for key in weights.keys():  # noqa: SIM118 - safe_open is not a mapping
            module = key.removesuffix(".weight")
            if not key.endswith(".weight") or not module.endswith(targets):
                continue
            out_features, in_features = weights.get_slice(key).get_shape()
            prefix = f"base_model.model.{module}"
            a = torch.randn(r, in_features, generator=generator) * 0.02
            b = torch.randn(out_features, r, generator=generator) * 0.02
            tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"] = a, b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": str(base),
        "r": r,
        "lora_alpha": alpha,
        "target_modules": sorted({t.rsplit(".", 1)[-1] for t in targets}),
        "bias": "none",
    }
    if "attention.output.dense" in targets:  # not the feed-forward's dense layers
        config["target_modules"] = r".*\.(" + "|".join(t.replace(".", r"\.") for t in targets) + ")"
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


class Serve:
    """`sr serve` with the given deployments of CPU workers at 1 thread, cache off."""

    def __init__(self, deployments: dict[str, tuple[str, int]], workdir: Path, kernel):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        catalog = {
            name: {"artifact": artifact, "replicas": [{"device": "cpu"}] * replicas}
            | ({"kernel": kernel} if kernel else {})
            for name, (artifact, replicas) in deployments.items()
        }
        first = next(iter(deployments))
        config = {
            "global": {"model_catalog": {"deployments": catalog,
                                         "system": {"decision_model": {"deployment": first}}}},
            "listeners": [{"host": "127.0.0.1", "port": self.port}],
        }  # fmt: skip
        path = workdir / f"config-{self.port}.json"  # JSON is YAML
        path.write_text(json.dumps(config))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_SRUN_RESULT_CACHE": "0"}
        argv = [sys.executable, "-m", "sr", "serve", "--config", str(path)]
        argv += ["--port", str(self.port), "--threads", "1"]
        self.proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.deployments = deployments

    def wait_ready(self, timeout_s: float = 240.0) -> dict[str, list[int]]:
        """Worker pids by deployment once every replica is ready."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"sr serve exited with {self.proc.returncode}")
            try:
                rows = httpx.get(f"{self.url}/api/v1/inventory/model-runtime", timeout=5).json()
                pids = {}
                for name, (_, replicas) in self.deployments.items():
                    found = rows["deployments"][name]["replicas"]
                    if len(found) == replicas and all(r["state"] == "ready" for r in found):
                        pids[name] = [r["pid"] for r in found]
                if len(pids) == len(self.deployments):
                    return pids
            except (httpx.TransportError, KeyError, ValueError):
                pass
            time.sleep(0.3)
        raise SystemExit(f"sr serve: not every replica ready in {timeout_s:.0f} s")

    def touch(self, requests: int) -> None:
        """Short, medium, long and batched texts on every replica of every deployment."""
        import httpx

        with httpx.Client(base_url=self.url, timeout=60) as client:
            for round_ in range(requests):
                for count, words in ((1, 4), (1, 100), (32, 30), (4, 200)):
                    for name, (_, replicas) in self.deployments.items():
                        for replica in range(replicas):
                            texts = _texts(count, words, f"{name}{round_}.{replica}")
                            body = {"model": name, "input": texts}
                            answer = client.post("/v1/embeddings", json=body)
                            if answer.status_code != 200:
                                raise SystemExit(f"{name}: /v1/embeddings {answer.status_code}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure(scenario: str, artifacts: dict[str, str], kernel, requests: int, tmp: Path) -> dict:
    deployments = {
        name: (artifacts[key], replicas) for name, (key, replicas) in SCENARIOS[scenario].items()
    }
    serve = Serve(deployments, tmp, kernel)
    try:
        by_deployment = serve.wait_ready()
        serve.touch(requests)
        time.sleep(IDLE_WAIT_S)  # the worker's trimmer gives kept batch memory back
        pids = [pid for group in by_deployment.values() for pid in group]
        workers = [
            {"pid": pid, "rollup_kb": smaps_rollup(pid), "weights_file_kb": mapped_file(pid)}
            for pid in pids
        ]
        # The router's fork server and each deployment's: the pages the workers share.
        helpers = servers_between(pids, serve.proc.pid)
        helper_rollups = {pid: smaps_rollup(pid) for pid in helpers}
        together = footprint(pids + helpers)
    finally:
        serve.stop()
    workers_pss = sum(w["rollup_kb"]["Pss"] for w in workers)
    helpers_pss = sum(r["Pss"] for r in helper_rollups.values())
    return {
        "scenario": scenario,
        "kernel": kernel or "auto",
        "deployments": {
            name: {"artifact": a, "replicas": n} for name, (a, n) in deployments.items()
        },
        "workers": workers,
        "fork_servers": [{"pid": pid, "rollup_kb": r} for pid, r in helper_rollups.items()],
        "workers_pss_mib": round(workers_pss / MIB, 1),
        "fork_servers_pss_mib": round(helpers_pss / MIB, 1),
        "total_pss_mib": round((workers_pss + helpers_pss) / MIB, 1),
        "footprint": together,
    }


def merged_bytes(adapter: Path) -> dict:
    """What merging the adapter makes private: the merged tensors' MiB."""
    from sr.models.adapter import open_adapter

    opened = open_adapter(adapter)
    weights = opened.merged_weights()
    stripped = {name.removeprefix("bert.") for name in opened.merged}
    size = sum(weights[f"{name}.weight"].nbytes for name in stripped)
    return {"modules": len(opened.merged), "merged_mib": round(size / 2**20, 1)}


def report(results: list[dict], merges: dict) -> None:
    rows = []
    for r in results:
        f = r["footprint"]
        private = sum(f["private_per_process_mib"].values())
        rows.append((
            r["kernel"], r["scenario"], r["workers_pss_mib"], r["fork_servers_pss_mib"],
            r["total_pss_mib"], f["total_mib"], round(sum(f["shared_mib"].values()), 1),
            round(private, 1),
            round(sum(w["weights_file_kb"]["Rss"] for w in r["workers"]) / MIB, 1),
        ))  # fmt: skip
    print("Two workers per scenario, idle after traffic (MiB):")
    print_table(
        ("kernel", "scenario", "workers PSS", "fork servers PSS", "total PSS",
         "footprint", "shared", "private per process", "workers' weights-file RSS"),
        rows,
    )  # fmt: skip
    for name, merge in merges.items():
        print(f"adapter {name}: {merge['modules']} modules merged, {merge['merged_mib']} MiB")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="a BERT model folder (default: MiniLM)")
    parser.add_argument("--kernels", default="auto,blas", help="deployment kernels to measure")
    parser.add_argument("--requests", type=int, default=3, help="rounds of touching requests")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which to run")
    args = parser.parse_args(argv)
    from sr.models.artifacts import resolve_artifact

    base = Path(args.base) if args.base else resolve_artifact(embedded_artifact())
    results = []
    with tempfile.TemporaryDirectory(prefix="sr-bench-adapter-memory-") as tmp:
        root = Path(tmp)
        artifacts = {"base": str(base)}
        for seed, (name, (r, alpha, targets)) in enumerate(ADAPTERS.items()):
            artifacts[name] = str(write_adapter(base, root / name, r, alpha, targets, seed))
        merges = {name: merged_bytes(Path(artifacts[name])) for name in ADAPTERS}
        for kernel in args.kernels.split(","):
            for scenario in args.scenarios.split(","):
                print(f"measuring {scenario}, kernel {kernel} ...", flush=True)
                results.append(
                    measure(scenario, artifacts, None if kernel == "auto" else kernel,
                            args.requests, root)
                )  # fmt: skip
    report(results, merges)
    result = {
        "benchmark": "adapter_memory",
        "base": str(base),
        "adapters": {
            n: {"r": r, "alpha": a, "targets": list(t)} for n, (r, a, t) in ADAPTERS.items()
        },
        "merged": merges,
        "threads": 1,
        "requests": args.requests,
        "results": results,
    }
    write_result("adapter_memory", result)
    return result


if __name__ == "__main__":
    main()
