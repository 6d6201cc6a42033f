"""Embed the sr router in your own Trio program (SPEC section 9).

    python examples/embed_in_trio_app.py                 # embedded MiniLM on cpu
    python examples/embed_in_trio_app.py /path/to/model  # any local model folder
    python examples/embed_in_trio_app.py --in-process    # no child processes

The router starts and supervises the workers; leaving the `async with` block drains and
stops them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

try:
    import sr
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sr

import trio

from sr.config.schema import default_config


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


async def main(model: str | None, in_process: bool) -> None:
    config = default_config()
    if model is not None:
        config.deployments["primary"].artifact = str(Path(model).resolve())
    async with sr.open_router(config, in_process=in_process) as router:
        await router.wait_ready(timeout_s=300)
        sentences = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock prices fell."]
        answer = await router.request("primary", "/v1/embeddings", {"input": sentences})
        vectors = [row["embedding"] for row in answer["data"]]
        print(f"{len(vectors)} embeddings of dimension {len(vectors[0])}")
        for i in (1, 2):
            print(
                f"cosine({sentences[0]!r}, {sentences[i]!r}) = {cosine(vectors[0], vectors[i]):.3f}"
            )
        replica = router.inventory()["deployments"]["primary"]["replicas"][0]
        print(json.dumps({k: replica[k] for k in ("id", "device", "state", "threads", "pid")}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a local model folder (default: MiniLM)")
    parser.add_argument("--in-process", action="store_true", help="run the worker in-process")
    args = parser.parse_args()
    trio.run(main, args.model, args.in_process)
