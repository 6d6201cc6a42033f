"""Embed the sr router in your own Trio program (docs/python-api.md).

    python examples/embed_in_trio_app.py                 # embedded MiniLM on cpu
    python examples/embed_in_trio_app.py /path/to/model  # any local model folder
    python examples/embed_in_trio_app.py --in-process    # no child processes
    python examples/embed_in_trio_app.py --serve         # also serve HTTP meanwhile

The router starts and supervises the workers; leaving the `async with` block (or
`shutdown()` of what `sr.serve` started) drains and stops them. Type-checked with
`mypy --strict` (tests/test_python_api.py).
"""

from __future__ import annotations

import argparse
import functools
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

from sr.config.schema import SrConfig, default_config
from sr.errors import InvalidRequest

SENTENCES = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock prices fell."]


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


async def use(router: sr.Supervisor) -> None:
    """What a program does with the pool, whichever way it was started."""
    await router.wait_ready(timeout_s=300)
    embeddings = await router.embed("primary", SENTENCES)
    print(f"{len(embeddings.vectors)} embeddings of dimension {len(embeddings.vectors[0])}")
    print(f"model {embeddings.model}, {embeddings.usage.prompt_tokens} tokens")
    for i in (1, 2):
        similarity = cosine(embeddings.vectors[0], embeddings.vectors[i])
        print(f"cosine({SENTENCES[0]!r}, {SENTENCES[i]!r}) = {similarity:.3f}")
    short = await router.embed("primary", SENTENCES[0], dimensions=64)
    print(f"dimensions=64: {len(short.vectors[0])} values")

    topics = {"animals": "a text about animals", "finance": "a text about money and markets"}
    classified = await router.classify("primary", SENTENCES, labels=topics)
    for text, result in zip(SENTENCES, classified.results, strict=True):
        print(f"{text!r}: {result.label} ({result.probabilities[result.label]:.2f})")

    question = sr.Question(
        criteria={"refund": "the customer wants money back", "praise": "the customer is happy"}
    )
    decided = await router.decide("primary", "I want my money back!", {"intent": question})
    intent = decided.answers["intent"]
    print(f"intent: {intent.choice} (confidence {intent.confidence:.2f})")

    try:  # MiniLM embeds; reranking needs a cross-encoder deployment
        await router.rerank("primary", "cats", SENTENCES)
    except InvalidRequest as error:
        print(f"rerank refused ({error.status} {error.code}): {error.message}")

    replica = router.inventory().deployments["primary"].replicas[0]  # typed: sr.pool.views
    shown = {"id": replica.id, "device": replica.device, "state": replica.state.value}
    print(json.dumps({**shown, "threads": replica.threads, "pid": replica.pid}))


async def main(model: str | None, in_process: bool, serve_http: bool) -> None:
    config: SrConfig = default_config()
    if model is not None:
        config.deployments["primary"].artifact = str(Path(model).resolve())
    if not serve_http:
        async with sr.open_router(config, in_process=in_process) as router:
            await use(router)
        return
    async with trio.open_nursery() as nursery:
        start = functools.partial(sr.serve, config, port=0, in_process=in_process)
        server: sr.ServingRouter = await nursery.start(start)
        print(f"serving on {server.url} (curl {server.url}/v1/models)")
        await use(server.core)
        server.shutdown()  # graceful: in-flight requests finish, then the workers stop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", nargs="?", help="a local model folder (default: MiniLM)")
    parser.add_argument("--in-process", action="store_true", help="run the worker in-process")
    parser.add_argument("--serve", action="store_true", help="also serve HTTP on a free port")
    args = parser.parse_args()
    trio.run(main, args.model, args.in_process, args.serve)
