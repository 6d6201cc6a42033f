"""POST /api/v1/faults through a real `sr serve` (SR_FAULT_INJECTION=1): the router reaches
the named replica's worker, and the pool reacts to the fault it injects."""

from __future__ import annotations

import pytest

from tests.serve_process import ServeProcess, poll_until, serve_config

pytestmark = pytest.mark.chaos

EMBED = {"model": "primary", "input": "fault route"}


def test_fault_route_fails_one_replica_and_clears_it(serve):
    router = serve(2)
    target, other = router.replicas()
    answer = router.client.post(
        "/api/v1/faults", json={"deployment": "primary", "replica": target["id"], "mode": "fail"}
    )
    assert answer.status_code == 200, answer.text
    replies = [router.client.post("/v1/embeddings", json=EMBED) for _ in range(6)]
    codes = [reply.status_code for reply in replies]
    # The failing replica answers 502 at most once before backoff takes it out of dispatch.
    assert codes.count(502) <= 1 and codes.count(200) >= 5, codes
    assert {r.headers.get("x-sr-replica") for r in replies if r.status_code == 200} == {other["id"]}
    states = {row["id"]: row["state"] for row in router.replicas()}
    assert states[other["id"]] == "ready"
    cleared = router.client.post(
        "/api/v1/faults", json={"deployment": "primary", "replica": target["id"], "mode": "none"}
    )
    assert cleared.status_code == 200, cleared.text

    def both_serve() -> bool:
        served = {
            router.client.post("/v1/embeddings", json=EMBED).headers.get("x-sr-replica")
            for _ in range(4)
        }
        return served == {target["id"], other["id"]}

    poll_until(both_serve, 10, "the cleared replica back in dispatch", poll_s=0.2)


def test_fault_route_is_404_without_fault_injection(tmp_path, tiny_model_dir):
    router = ServeProcess(tmp_path, serve_config(tiny_model_dir, 1))
    try:
        router.start()
        answer = router.client.post(
            "/api/v1/faults", json={"deployment": "primary", "replica": 0, "mode": "hang"}
        )
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"
    finally:
        assert router.stop() == []
