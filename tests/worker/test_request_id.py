"""The router's request id in the worker: error bodies and log lines carry it."""

import json
import logging

from sr import request_id
from sr.http.hop import Hop
from sr.logs import JsonLineFormatter
from sr.worker.http import request_names


def test_the_headers_are_read_and_odd_values_are_ignored():
    headers = [(b"host", b"w"), (b"x-request-id", b"abc-1"), (b"x-sr-deployment", b"minilm")]
    assert request_names(headers) == ("abc-1", "minilm", None)
    assert request_names([(b"host", b"w")]) == (None, None, None)
    for odd in (b"", b"a b", b"x" * 129, "é".encode()):
        assert request_names([(b"x-request-id", odd)]) == (None, None, None)
    for odd in (b"", b"-lead", b"a/b", b"x" * 65, "é".encode()):
        assert request_names([(b"x-sr-deployment", odd)]) == (None, None, None)
    parent = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    assert request_names([(b"traceparent", parent)]) == (None, None, parent.decode())
    assert request_names([(b"traceparent", b"0" * 129)]) == (None, None, None)


async def test_an_error_answer_carries_the_request_id(worker):
    status, _, body = await worker.handle("POST", "/v1/embeddings", b'{"input": 5}', Hop("r-7"))
    assert status == 400
    assert json.loads(body)["error"]["request_id"] == "r-7"
    status, _, body = await worker.handle("POST", "/v1/embeddings", b'{"input": 5}')
    assert "request_id" not in json.loads(body)["error"]
    assert request_id.current.get() is None


async def test_a_log_line_written_while_answering_carries_it(worker, monkeypatch):
    lines: list[dict] = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(json.loads(JsonLineFormatter().format(record)))

    async def broken(body):
        raise RuntimeError("a bug")

    monkeypatch.setitem(worker._routes, "/v1/embeddings", ("POST", broken))
    logger = logging.getLogger("sr.worker")
    handler = Lines()
    logger.addHandler(handler)
    try:
        status, _, _ = await worker.handle("POST", "/v1/embeddings", b"{}", Hop("r-8"))
    finally:
        logger.removeHandler(handler)
    assert status == 500
    assert [line["request_id"] for line in lines] == ["r-8"]
