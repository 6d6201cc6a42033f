"""Chaos fixtures: `sr serve` subprocesses that never outlive their test."""

from __future__ import annotations

import pytest

from tests.chaos.harness import ServeProcess, deployment_config, wait_gone


@pytest.fixture
def serve(tmp_path, tiny_model_dir):
    """`serve(replicas, **config) -> ServeProcess` started and all replicas ready."""
    started: list[ServeProcess] = []

    def start(replicas: int, *, env=None, all_ready=True, **config) -> ServeProcess:
        workdir = tmp_path / f"serve-{len(started)}"
        workdir.mkdir()
        process = ServeProcess(
            workdir, deployment_config(tiny_model_dir, replicas, **config), env=env
        )
        started.append(process)
        process.start(all_ready=all_ready)
        return process

    yield start
    for process in started:
        process.stop()
        orphans = wait_gone(process.seen_pids)
        assert not orphans, f"worker processes outlived sr serve: {orphans}"
