"""Two `sr serve` runs on one cache folder: the second's forked worker takes the golden check
and the batching probe the first kept (sr.worker.kept_checks), and answers the same bits."""

from __future__ import annotations

import pytest

from tests.serve_process import ServeProcess, poll_until, serve_config

pytestmark = pytest.mark.e2e


def test_a_second_sr_serve_takes_the_start_checks_the_first_kept(tmp_path, tiny_model_dir):
    env = {"SR_CACHE_DIR": str(tmp_path / "cache"), "SR_LOG_FORMAT": "json"}
    details, vectors = [], []
    for run in ("first", "second"):
        workdir = tmp_path / run
        workdir.mkdir()
        router = ServeProcess(workdir, serve_config(tiny_model_dir, 1), env=env)
        try:
            router.start(timeout_s=90)
            answer = router.client.post(
                "/v1/embeddings", json={"model": "primary", "input": "kept checks"}
            )
            assert answer.status_code == 200, answer.text
            vectors.append(answer.json()["data"][0]["embedding"])
            poll_until(lambda r=router: r.events("worker_batching"), 10, "worker_batching")
            batching = router.events("worker_batching")[0]
            assert batching["exact_batching"] is True, batching
            details.append(batching["detail"])
        finally:
            assert router.stop() == []
    assert not details[0].endswith("(probed at an earlier start)")
    assert details[1] == details[0] + " (probed at an earlier start)"
    assert vectors[0] == vectors[1]
    assert (tmp_path / "cache" / "start-checks.json").is_file()
