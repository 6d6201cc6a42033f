"""`sr serve` as a real process with two tiny-BERT workers: endpoints, errors, signals."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.serve_process import ServeProcess, pid_alive, serve_config, set_fault

pytestmark = pytest.mark.e2e

EMBED = {"model": "primary", "input": ["hello world", "second"]}


@pytest.fixture(scope="module")
def router(tmp_path_factory, tiny_model_dir):
    workdir = tmp_path_factory.mktemp("router-e2e")
    process = ServeProcess(workdir, config(tiny_model_dir), fault_injection=True)
    process.artifact = str(tiny_model_dir)
    process.start(timeout_s=40)
    yield process
    process.stop()


def config(artifact, api_keys=None):
    # Ejection off: the fault tests time out both replicas on purpose.
    return serve_config(artifact, 2, outlier={"consecutive_timeouts": 0}, api_keys=api_keys)


def test_health_ready_startup_models_inventory(router):
    assert router.client.get("/health").status_code == 200
    assert router.client.get("/ready").json() == {"status": "ready"}
    startup = router.client.get("/startup-status").json()
    assert startup["deployments"]["primary"]["desired_replicas"] == 2
    models = router.client.get("/v1/models").json()["data"]
    assert models == [
        {
            "id": "primary",
            "object": "model",
            "created": models[0]["created"],
            "owned_by": "sr",
            "artifact": router.artifact,
            "replicas": 2,
            "ready_replicas": models[0]["ready_replicas"],
            "ready": True,
            "base_path": "/d/primary/",
            # The folder has no config_sentence_transformers.json: sentence-transformers'
            # own prompts, empty.
            "prompts": {"texts": {"query": "", "document": ""}, "default_prompt_name": None},
        }
    ]
    replicas = router.replicas()
    assert len(replicas) == 2
    assert all(pid_alive(r["pid"]) for r in replicas)


def test_native_routes_answer_with_the_public_name(router):
    embedded = router.client.post("/v1/embeddings", json=EMBED)
    assert embedded.status_code == 200, embedded.text
    body = embedded.json()
    assert body["model"] == "primary"
    assert [d["index"] for d in body["data"]] == [0, 1]
    by_artifact = router.client.post("/v1/embeddings", json={**EMBED, "model": router.artifact})
    assert by_artifact.json()["model"] == router.artifact
    assert by_artifact.json()["data"] == body["data"]
    classified = router.client.post(
        "/v1/classify",
        json={"model": "primary", "input": "hi", "labels": {"a": "greeting", "b": "farewell"}},
    )
    assert classified.status_code == 200, classified.text
    assert classified.json()["model"] == "primary"
    decided = router.client.post(
        "/v1/decisions",
        json={
            "model": "primary",
            "state": "the user says hello",
            "questions": {"q": {"type": "choice", "criteria": {"yes": "greets", "no": "not"}}},
        },
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["answers"]["q"]["choice"] in ("yes", "no")
    served_by = {
        router.client.post("/v1/embeddings", json=EMBED).headers["x-sr-replica"] for _ in range(6)
    }
    assert served_by == {r["id"] for r in router.replicas()}  # least outstanding, LRA ties


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"content": b"{oops"}, 400, "invalid_request"),
        ({"json": ["model"]}, 400, "invalid_request"),
        ({"json": {"input": "x"}}, 400, "invalid_request"),
        ({"json": {"model": "nope", "input": "x"}}, 404, "model_not_found"),
        ({"json": {"model": "primary", "input": 5}}, 400, "invalid_request"),  # from the worker
        ({"json": EMBED, "headers": {"X-Request-Timeout-Ms": "0"}}, 400, "invalid_request"),
        ({"content": b'{"model":"primary","input":"' + b"x" * (5 << 20) + b'"}'}, 413,
         "request_too_large"),
    ],
)  # fmt: skip
def test_request_errors(router, kwargs, status, code):
    answer = router.client.post("/v1/embeddings", **kwargs)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code


def test_unknown_route_and_wrong_method(router):
    assert router.client.get("/nope").json()["error"]["code"] == "not_found"
    wrong = router.client.put("/v1/embeddings", json=EMBED)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_timeout_unavailable_and_worker_failed(router):
    pids = router.worker_pids()
    try:
        for pid in pids:
            set_fault(pid, "slow", 1500)
        short = {"X-Request-Timeout-Ms": "150"}
        late = router.client.post("/v1/embeddings", json=EMBED, headers=short)
        assert late.status_code == 504
        assert late.json()["error"]["code"] == "timeout"
        codes = []
        for _ in range(5):  # time out both replicas, then ask while both are in backoff
            router.client.post("/v1/embeddings", json=EMBED, headers=short)
            router.client.post("/v1/embeddings", json=EMBED, headers=short)
            codes.append(router.client.post("/v1/embeddings", json=EMBED, headers=short).json())
            if any(c.get("error", {}).get("code") == "unavailable" for c in codes):
                break
        assert any(c.get("error", {}).get("code") == "unavailable" for c in codes), codes
        for pid in pids:
            set_fault(pid, "fail")
        router.wait_all_ready()  # request backoff is over
        failed = router.client.post("/v1/embeddings", json=EMBED)
        assert failed.status_code == 502
        assert failed.json()["error"]["code"] == "worker_failed"
    finally:
        for pid in pids:
            set_fault(pid, "none")
    router.wait_all_ready()
    assert router.client.post("/v1/embeddings", json=EMBED).status_code == 200


async def test_overloaded_when_every_replica_is_full(router):
    pids = router.worker_pids()
    for pid in pids:
        set_fault(pid, "hang")
    statuses: list[int] = []
    try:
        with trio.fail_after(20):
            limits = httpx.Limits(max_connections=100)
            client = httpx.AsyncClient(base_url=router.url, timeout=15, limits=limits)
            async with client, trio.open_nursery() as nursery:

                async def hung():
                    answer = await client.post("/v1/embeddings", json=EMBED)
                    statuses.append(answer.status_code)

                for _ in range(64):  # 32 per worker fills both
                    nursery.start_soon(hung)
                while sum(r["inflight"] for r in router.replicas()) < 64:
                    await trio.sleep(0.05)
                refused = await client.post("/v1/embeddings", json=EMBED)
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "overloaded"
                assert refused.headers["retry-after"].isdigit()
                for pid in pids:
                    set_fault(pid, "none")  # releases the hung forwards
    finally:
        for pid in pids:
            set_fault(pid, "none")
    assert statuses == [200] * 64


def test_metrics_text(router):
    router.client.post("/v1/embeddings", json=EMBED)
    text = router.client.get("/metrics").text
    assert 'sr_requests_total{deployment="primary",outcome="ok",route="/v1/embeddings"}' in text
    for replica in router.replicas():
        assert f'sr_replica_ready{{deployment="primary",replica="{replica["id"]}"}} 1.0' in text
    assert "sr_request_duration_seconds_bucket" in text


def test_api_keys_via_reload_keep_workers(router):
    pids = sorted(router.worker_pids())
    router.configure(config(router.artifact, api_keys=["e2e-key"]))
    assert router.client.post("/api/v1/reload").status_code == 200
    try:
        denied = router.client.post("/v1/embeddings", json=EMBED)
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        assert denied.headers["www-authenticate"] == "Bearer"
        assert router.client.get("/metrics").status_code == 401
        assert router.client.get("/health").status_code == 200
        assert router.client.get("/ready").status_code == 200
        auth = {"Authorization": "Bearer e2e-key"}
        assert router.client.post("/v1/embeddings", json=EMBED, headers=auth).status_code == 200
        assert sorted(router.inventory(auth)["deployments"]["primary"]["replicas"][i]["pid"]
                      for i in range(2)) == pids  # fmt: skip
    finally:
        router.configure(config(router.artifact))
        router.client.post("/api/v1/reload", headers={"Authorization": "Bearer e2e-key"})
    router.config_path.write_text("global: {typo: 1}\n")
    rejected = router.client.post("/api/v1/reload")
    assert rejected.status_code == 400
    assert rejected.json()["error"]["code"] == "invalid_config"
    router.configure(config(router.artifact))
    assert router.client.post("/v1/embeddings", json=EMBED).status_code == 200
