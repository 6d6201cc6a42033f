"""The router's /metrics through the in-memory app with a fake pool: a worker's timing
observed and written as TEI's headers on TEI's routes only, per-replica batch series from
scrapes, build and model info, the process collectors, no `_created` series, and
promtool's verdict."""

from __future__ import annotations

import importlib.metadata
import platform

import sr
from sr.config.schema import Deployment, Replica, SrConfig
from sr.pool.worker_exchange import ReplicaScrape
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics
from sr.worker.metrics import WorkerMetrics
from tests.metrics_text import families, named, needs_promtool, promtool_check, samples

from .asgi_client import call
from .fake_core import FakeReply, FakeRouterCore, echo_embeddings, make_config

# What a worker sends: total, tokenization, queue and inference us, tokens, characters.
WORKER_TIMING = {"x-sr-timing": "15900 1200 4000 9700 7 12"}
# What a TEI route's caller gets from it (TEI's names; whole milliseconds).
TEI_TIMING = {
    "x-compute-time": "15",
    "x-compute-tokens": "7",
    "x-total-time": "15",
    "x-tokenization-time": "1",
    "x-queue-time": "4",
    "x-inference-time": "9",  # 9.7 ms, cut down as TEI cuts it
    "x-compute-characters": "12",
}
EMBED = {"model": "primary", "input": "a"}
ROUTE = (("deployment", "primary"), ("route", "/v1/embeddings"))


def build(core: FakeRouterCore, served: dict[str, str] | None = None) -> RouterApp:
    """`served`: the dtype each deployment's (fake) ready replicas report on their cards."""
    metrics = RouterMetrics(
        core.inventory,
        deployments=lambda: core.config.deployments,
        served_dtype=None if served is None else served.get,
    )
    return RouterApp(core, core.config, metrics=metrics, cache=ResultCache(0))


def replying(status: int, headers: dict[str, str]):
    async def handler(deployment, path, body, timeout_s):
        reply = await echo_embeddings(deployment, path, body, timeout_s)
        return FakeReply(status, headers, reply.body, reply.replica_id)

    return handler


async def scrape(app: RouterApp) -> str:
    answer = await call(app, "GET", "/metrics")
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return answer.body.decode()


async def test_a_workers_timing_feeds_the_histograms_and_only_tei_routes_get_its_headers():
    headers = {**WORKER_TIMING, "x-worker-secret": "stays", "content-type": "application/json"}
    core = FakeRouterCore(make_config({"primary": 1}), replying(200, headers))
    app = build(core)
    answer = await call(app, "POST", "/v1/embeddings", EMBED)
    assert answer.status == 200
    assert not set(answer.headers) & {*TEI_TIMING, "x-sr-timing", "x-worker-secret"}
    assert answer.headers["x-sr-replica"] == "primary-0"
    tei = await call(app, "POST", "/embed", {"inputs": "a"})
    assert tei.status == 200, tei.body
    assert {k: tei.headers[k] for k in TEI_TIMING} == TEI_TIMING
    assert not set(tei.headers) & {"x-sr-timing", "x-worker-secret"}
    found = samples(await scrape(app))
    assert found[("sr_request_queue_seconds_count", ROUTE)] == 1
    assert found[("sr_request_queue_seconds_sum", ROUTE)] == 0.004
    assert found[("sr_request_queue_seconds_bucket", (*ROUTE[:1], ("le", "0.0025"), ROUTE[1]))] == 0
    assert found[("sr_request_queue_seconds_bucket", (*ROUTE[:1], ("le", "0.005"), ROUTE[1]))] == 1
    assert found[("sr_request_inference_seconds_sum", ROUTE)] == 0.0097
    assert found[("sr_input_tokens_total", ROUTE)] == 7
    tei_route = (("deployment", "primary"), ("route", "/embed"))
    assert found[("sr_input_tokens_total", tei_route)] == 7


async def test_answers_without_usable_timing_are_not_observed():
    core = FakeRouterCore(make_config({"primary": 1}), replying(200, WORKER_TIMING))
    app = build(core)
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200
    core.handler = replying(200, {})  # a worker that sends no timing (another version)
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200
    core.handler = replying(200, {"x-sr-timing": "15 1 -3 9 7 12"})
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200
    core.handler = replying(400, WORKER_TIMING)  # the worker refused it: no work was timed
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 400
    found = samples(await scrape(app))
    assert found[("sr_request_queue_seconds_count", ROUTE)] == 1
    assert found[("sr_input_tokens_total", ROUTE)] == 7


def worker_text(forwards: list[tuple[int, int, int, float]], queued: int) -> str:
    """A worker's real /metrics text after these forwards (rows, padded, requests, s)."""
    metrics = WorkerMetrics()
    for forward in forwards:
        metrics.observe_forward(*forward)
    metrics.watch_queue(lambda: queued)
    metrics.count_answer("/v1/embeddings", 200)
    return metrics.render().decode()


async def test_replica_batch_series_come_from_the_scrapes():
    core = FakeRouterCore(make_config({"primary": 3}))
    core.replica_scrapes = [
        ReplicaScrape("primary", "primary-0", worker_text([(3, 24, 2, 0.004)] * 2, queued=5)),
        ReplicaScrape("primary", "primary-1", None),  # no answer in time
        ReplicaScrape("primary", "primary-2", "this is {not prometheus"),
    ]
    app = build(core)
    text = await scrape(app)
    assert core.scrape_timeouts == [1.0]
    found = samples(text)
    r0 = (("deployment", "primary"), ("replica", "primary-0"))
    assert named(found, "sr_replica_metrics_up") == {
        r0: 1.0,
        (("deployment", "primary"), ("replica", "primary-1")): 0.0,
        (("deployment", "primary"), ("replica", "primary-2")): 0.0,
    }
    assert named(found, "sr_replica_batch_rows_count") == {r0: 2.0}
    assert found[("sr_replica_batch_rows_sum", r0)] == 6
    le_2, le_4 = (r0[0], ("le", "2.0"), r0[1]), (r0[0], ("le", "4.0"), r0[1])
    assert found[("sr_replica_batch_rows_bucket", le_2)] == 0
    assert found[("sr_replica_batch_rows_bucket", le_4)] == 2
    assert found[("sr_replica_batch_padded_tokens_sum", r0)] == 48
    assert found[("sr_replica_batch_requests_sum", r0)] == 4
    assert found[("sr_replica_forward_seconds_count", r0)] == 2
    assert found[("sr_replica_forward_seconds_sum", r0)] == 0.008
    assert found[("sr_replica_queued_rows", r0)] == 5
    assert found[("sr_replica_rows_total", r0)] == 6
    assert found[("sr_replica_forwards_total", r0)] == 2
    kinds = families(text)
    assert kinds["sr_replica_batch_rows"] == "histogram"
    assert kinds["sr_replica_rows"] == "counter"
    assert kinds["sr_replica_queued_rows"] == "gauge"
    assert not any(name.startswith("sr_worker_") for name in kinds)  # renamed, not copied
    # The scrapes were for this render only.
    assert "sr_replica_batch_rows" not in families(app.metrics.render().decode())


async def test_build_and_model_info_follow_the_config():
    config = SrConfig()
    config.deployments["primary"] = Deployment(
        artifact="org/model", revision="abc123", dtype="bfloat16", replicas=[Replica()]
    )
    core = FakeRouterCore(config)
    served: dict[str, str] = {}
    app = build(core, served)
    found = samples(await scrape(app))
    build_info = {
        ("python", platform.python_version()),
        ("torch", importlib.metadata.version("torch")),
        ("version", sr.__version__),
    }
    assert named(found, "sr_build_info") == {tuple(sorted(build_info)): 1.0}
    info = (("artifact", "org/model"), ("deployment", "primary"), ("dtype", "bfloat16"))
    assert named(found, "sr_model_info") == {(*info, ("revision", "abc123")): 1.0}
    await core.reload(make_config({"other": 1}))
    found = samples(await scrape(app))
    # The config's `auto` until a ready replica's card says what its host serves.
    other = (("artifact", "/models/other"), ("deployment", "other"), ("dtype", "auto"))
    assert named(found, "sr_model_info") == {(*other, ("revision", "")): 1.0}
    served["other"] = "bfloat16"
    found = samples(await scrape(app))
    other = (("artifact", "/models/other"), ("deployment", "other"), ("dtype", "bfloat16"))
    assert named(found, "sr_model_info") == {(*other, ("revision", "")): 1.0}


async def test_process_collectors_and_no_created_series():
    core = FakeRouterCore(make_config({"primary": 1}), replying(200, WORKER_TIMING))
    app = build(core)
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200
    text = await scrape(app)
    kinds = families(text)
    assert "process_resident_memory_bytes" in kinds
    assert "python_info" in kinds
    assert "sr_requests" in kinds and "sr_request_duration_seconds" in kinds
    assert "_created" not in text


@needs_promtool
async def test_promtool_accepts_the_whole_text():
    core = FakeRouterCore(make_config({"primary": 2}), replying(200, WORKER_TIMING))
    core.replica_scrapes = [
        ReplicaScrape("primary", "primary-0", worker_text([(3, 24, 2, 0.004)], queued=1)),
        ReplicaScrape("primary", "primary-1", worker_text([(1, 8, 1, 0.002)], queued=0)),
    ]
    app = build(core)
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200
    promtool_check(await scrape(app))
