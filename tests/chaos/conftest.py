"""Chaos fixtures: `sr serve` subprocesses that never outlive their test."""

from __future__ import annotations

import pytest

from tests.serve_process import ServeProcess, serve_config


@pytest.fixture
def serve(tmp_path, tiny_model_dir):
    """`serve(replicas, **config) -> ServeProcess` with fault injection, started and all
    replicas ready (unless `all_ready=False`)."""
    started: list[ServeProcess] = []

    def start(replicas: int, *, env=None, all_ready=True, **config) -> ServeProcess:
        workdir = tmp_path / f"serve-{len(started)}"
        workdir.mkdir()
        process = ServeProcess(
            workdir,
            serve_config(tiny_model_dir, replicas, **config),
            env=env,
            fault_injection=True,
        )
        started.append(process)
        process.start(all_ready=all_ready)
        return process

    yield start
    orphans = [pid for process in started for pid in process.stop()]
    assert not orphans, f"worker processes outlived sr serve: {orphans}"
