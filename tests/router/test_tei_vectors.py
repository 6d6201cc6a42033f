"""TEI's /embed and /embed_all answers: the worker's vectors in index order, each number
exactly as the worker wrote it (never read back as a float and written again)."""

from __future__ import annotations

import json
import threading

from sr.router import app as app_module
from sr.router import tei

from .asgi_client import call
from .fake_core import FakeReply
from .test_tei import build


def _native(field: str, vectors: list[str], order: list[int]) -> bytes:
    """A native list answer whose items come in `order`; `vectors` are raw JSON texts."""
    items = ",".join(f'{{"object":"x","index":{i},"{field}":{vectors[i]}}}' for i in order)
    return (
        f'{{"object":"list","model":"m","data":[{items}],'
        '"usage":{"prompt_tokens":3,"total_tokens":3}}'
    ).encode()


def test_embed_keeps_each_numbers_text_and_orders_by_index_as_a_number():
    # Twelve rows, so that "10" and "11" would sort before "2" as text.
    vectors = [f"[{i},0.100000001,-0,1.23456789e-05,NaN]" for i in range(12)]
    order = [11, 3, 0, 10, 2, 1, 9, 4, 8, 5, 7, 6]
    request = tei.parse_request(tei.EMBED, b'{"inputs":["a"]}', None, None)
    answer = tei.tei_answer(request, _native("embedding", vectors, order))
    assert answer == ("[" + ",".join(vectors) + "]").encode()
    # What json reads from it is what it reads from the worker's vectors.
    assert json.loads(answer)[10] == json.loads(vectors[10])


def test_embed_all_keeps_per_token_vectors():
    rows = ["[[0.5,-1],[2.5e+10,3]]", "[[7,8.125]]"]
    request = tei.parse_request(tei.EMBED_ALL, b'{"inputs":["a","b"]}', None, None)
    answer = tei.tei_answer(request, _native("embeddings", rows, [1, 0]))
    assert answer == b"[[[0.5,-1],[2.5e+10,3]],[[7,8.125]]]"


async def test_a_large_answer_is_rewritten_off_the_event_loop(monkeypatch):
    """A MiB of vectors takes tens of ms to rewrite in TEI's shape: on a helper thread, so
    the router's other requests are served meanwhile; a small answer inline."""
    threads: list[bool] = []
    rewrite = tei.tei_answer

    def recording(request, payload):
        threads.append(threading.current_thread() is threading.main_thread())
        return rewrite(request, payload)

    monkeypatch.setattr(tei, "tei_answer", recording)
    width = 1 + app_module._INLINE_REWRITE_BYTES // 12  # over the size as "0.100000001,"

    async def worker(deployment, path, body, timeout_s):
        count = len(json.loads(body)["input"])
        vector = "[" + ",".join(["0.100000001"] * (width if count > 1 else 2)) + "]"
        payload = _native("embedding", [vector] * count, list(range(count)))
        return FakeReply(200, {}, payload, "primary-0")

    app, _core = build(handler=worker)
    small = await call(app, "POST", "/embed", {"inputs": ["a"]})
    assert small.status == 200 and threads == [True]
    large = await call(app, "POST", "/embed", {"inputs": ["a", "b"]})
    assert large.status == 200 and threads == [True, False]
    assert len(large.body) > app_module._INLINE_REWRITE_BYTES
    assert large.json()[1][:2] == [0.100000001, 0.100000001]
