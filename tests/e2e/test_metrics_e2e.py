"""A real `sr serve` with one worker process (tiny BERT): TEI's timing headers on TEI's
routes (and none on the others),
the per-replica batch series at the router's /metrics, no `_created` series, and probes
that do not count as the worker's requests."""

from __future__ import annotations

import httpx
import pytest

from tests.metrics_text import named, promtool_check, samples
from tests.serve_process import ServeProcess, serve_config, worker_socket

pytestmark = pytest.mark.e2e

TEI_HEADERS = (
    "x-compute-time", "x-compute-tokens", "x-total-time", "x-tokenization-time",
    "x-queue-time", "x-inference-time",
)  # fmt: skip
# Three requests, six distinct texts: six rows computed, none from the worker's cache.
REQUESTS = [["the cat sat", "on the mat"], ["a dog barked", "twice"], ["rain", "then sun"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    process = ServeProcess(tmp_path_factory.mktemp("metrics-e2e"), serve_config(tiny_model_dir, 1))
    process.start(timeout_s=40)
    yield process
    assert process.stop() == []


@pytest.fixture(scope="module")
def answers(server):
    """The answers to REQUESTS, sent one after the other."""
    replies = []
    for texts in REQUESTS:
        reply = server.client.post("/v1/embeddings", json={"model": "primary", "input": texts})
        assert reply.status_code == 200, reply.text
        replies.append(reply)
    return replies


def worker_metrics(pid: int) -> dict:
    """The worker's own /metrics, straight at its Unix socket."""
    transport = httpx.HTTPTransport(uds=worker_socket(pid))
    with httpx.Client(transport=transport, base_url="http://worker", timeout=5) as client:
        for _ in range(3):
            assert client.get("/health").status_code == 200
        text = client.get("/metrics").text
    assert "_created" not in text
    return samples(text)


def test_native_answers_carry_no_timing_headers(answers):
    for reply in answers:
        assert not set(reply.headers) & {*TEI_HEADERS, "x-sr-timing"}, reply.headers


def test_router_metrics_show_each_replica_batches(server, answers):
    (replica,) = server.replicas()
    text = server.client.get("/metrics").text
    assert "_created" not in text
    found = samples(text)
    key = (("deployment", "primary"), ("replica", replica["id"]))
    assert named(found, "sr_replica_metrics_up") == {key: 1.0}
    assert found[("sr_replica_rows_total", key)] == 6
    forwards = found[("sr_replica_forwards_total", key)]
    assert 1 <= forwards <= len(REQUESTS)
    assert found[("sr_replica_batch_rows_count", key)] == forwards
    assert found[("sr_replica_batch_rows_sum", key)] == 6
    assert found[("sr_replica_batch_padded_tokens_sum", key)] >= 6
    assert found[("sr_replica_forward_seconds_count", key)] == forwards
    assert 0 < found[("sr_replica_forward_seconds_sum", key)] < 60
    assert found[("sr_replica_queued_rows", key)] == 0
    route = (("deployment", "primary"), ("route", "/v1/embeddings"))
    tokens = sum(reply.json()["usage"]["prompt_tokens"] for reply in answers)
    assert found[("sr_input_tokens_total", route)] == tokens
    assert found[("sr_request_queue_seconds_count", route)] == len(REQUESTS)
    assert found[("sr_request_inference_seconds_count", route)] == len(REQUESTS)
    (build,) = named(found, "sr_build_info")
    assert dict(build)["version"]
    (model,) = named(found, "sr_model_info")
    assert dict(model)["deployment"] == "primary"
    promtool_check(text)


def test_probes_do_not_count_as_worker_requests(server, answers):
    (pid,) = server.worker_pids()
    before = worker_metrics(pid)
    after = worker_metrics(pid)  # three more /health probes of our own, and a scrape
    requests = named(after, "sr_worker_requests_total")
    assert requests == named(before, "sr_worker_requests_total")
    assert requests[(("route", "/v1/embeddings"), ("status", "200"))] == len(REQUESTS)
    probe_routes = {"/health", "/health/live", "/metrics"}
    assert not {dict(labels)["route"] for labels in requests} & probe_routes
    health = (("route", "/health"), ("status", "200"))
    probes_before = named(before, "sr_worker_probes_total")[health]
    assert named(after, "sr_worker_probes_total")[health] >= probes_before + 3


def test_tei_answers_carry_numeric_timing_headers(server):
    """Last in the module: it computes rows the counts above do not expect."""
    texts = ["the timing", "of a TEI call"]
    reply = server.client.post("/embed", json={"inputs": texts})
    assert reply.status_code == 200, reply.text
    values = {name: reply.headers[name] for name in TEI_HEADERS}
    assert all(value.isdigit() for value in values.values()), values
    native = server.client.post("/v1/embeddings", json={"model": "primary", "input": texts})
    assert int(values["x-compute-tokens"]) == native.json()["usage"]["prompt_tokens"]
    assert int(values["x-queue-time"]) + int(values["x-inference-time"]) <= int(
        values["x-total-time"]
    )
    assert "x-sr-timing" not in reply.headers
