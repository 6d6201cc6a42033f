"""A deployment's fork server (sr.pool.forked.ModelForkServer, sr.worker.model_server): real
processes, tiny model on oneDNN (asked by name: packed weights, what preloading shares).
Replicas come from it and answer as a spawned worker does, bit for bit; a killed replica
restarts from it; a killed server is replaced; a server that cannot load means the router's
fork server forks; a retired model's server exits; the router's death ends them all."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys

import attrs
import pytest

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.models.artifacts import EMBEDDED_DEFAULT
from sr.pool import fork_start, forked, forkserver, open_router
from sr.pool.views import ReplicaView
from tests.pool.test_forkserver import cmdline, parent_of
from tests.pool.test_pool_e2e import wait_until
from tests.serve_process import ServeProcess, pid_alive, serve_config, wait_gone

pytestmark = pytest.mark.e2e

TEXTS = ["hello", "a longer text with a few more words in it", "x"]


def onednn_config(model_dir, replicas: int, name: str = "tiny") -> SrConfig:
    cfg = SrConfig()
    cfg.deployments[name] = Deployment(
        artifact=str(model_dir), replicas=[Replica(device="cpu")] * replicas, kernel="onednn"
    )
    return cfg


def replicas_of(core, name: str = "tiny") -> tuple[ReplicaView, ...]:
    return core.inventory().deployments[name].replicas


async def embeddings(core, name: str = "tiny") -> tuple[str, list]:
    body = ('{"input": ["' + '", "'.join(TEXTS) + '"]}').encode()
    reply = await core.request_raw(name, "/v1/embeddings", body, timeout_s=10)
    assert reply.status == 200, reply.body
    return reply.replica_id, [row["embedding"] for row in json.loads(reply.body)["data"]]


def is_model_server(pid: int, artifact) -> bool:
    argv = cmdline(pid)
    return "sr.pool.forkserver" in argv and argv[argv.index("--model") + 1] == str(artifact)


@pytest.fixture(autouse=True)
def _fork_start(monkeypatch):
    monkeypatch.setenv(forked.START_ENV, "fork")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


async def spawned_embeddings(model_dir, run_dir, monkeypatch) -> list:
    monkeypatch.setenv(forked.START_ENV, "spawn")
    async with open_router(onednn_config(model_dir, 1), threads=1, run_dir=run_dir) as core:
        await core.wait_ready(60)
        [worker] = replicas_of(core)
        assert parent_of(worker.pid) == os.getpid()
        _, vectors = await embeddings(core)
    monkeypatch.setenv(forked.START_ENV, "fork")
    return vectors


async def test_replicas_come_from_their_models_server_and_answer_as_a_spawned_worker(
    tiny_model_dir, tmp_path, monkeypatch
):
    spawned = await spawned_embeddings(tiny_model_dir, tmp_path / "spawned", monkeypatch)
    sink = RecordingSink()
    async with open_router(
        onednn_config(tiny_model_dir, 2), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        # ready: the card says onednn, as asked (else the pool holds it incompatible)
        await wait_until(lambda: all(r.ready for r in replicas_of(core)), 60)
        victim, survivor = replicas_of(core)
        server = parent_of(victim.pid)
        assert parent_of(survivor.pid) == server and is_model_server(server, tiny_model_dir)
        base = parent_of(server)  # the router's fork server forked the model's
        assert base != os.getpid() and "--control-fd" in cmdline(base)
        answered = {}
        for _ in range(4):
            replica, vectors = await embeddings(core)
            answered[replica] = vectors
        assert set(answered) == {victim.id, survivor.id}
        assert all(vectors == spawned for vectors in answered.values())  # bit for bit

        os.kill(victim.pid, signal.SIGKILL)
        await wait_until(lambda: replicas_of(core)[0].state.value == "restarting", 5)
        await wait_until(lambda: replicas_of(core)[0].state.value == "ready", 30)
        restarted = replicas_of(core)[0]
        assert parent_of(restarted.pid) == server  # the same loaded model, forked again
        while (await embeddings(core))[0] != victim.id:
            pass
        assert (await embeddings(core))[1] == spawned
        workers = [restarted.pid, survivor.pid]
    assert wait_gone([*workers, server, base], 10) == []
    assert sink.named("model_server_unavailable") == sink.named("fork_server_unavailable") == []
    [ready] = sink.named("model_server_ready")  # one server for both replicas and the restart
    assert ready["server_pid"] == server and ready["artifact"] == str(tiny_model_dir)
    assert ready["kernel"]["linear"] == "onednn" and ready["load_s"] > 0


async def test_a_killed_model_server_is_replaced_and_its_workers_serve_on(tiny_model_dir, tmp_path):
    sink = RecordingSink()
    async with open_router(
        onednn_config(tiny_model_dir, 1), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        worker = replicas_of(core)[0]
        server = parent_of(worker.pid)
        assert is_model_server(server, tiny_model_dir)
        os.kill(server, signal.SIGKILL)
        assert wait_gone([server], 5) == []
        assert (await embeddings(core))[0] == worker.id  # its worker does not need it

        os.kill(worker.pid, signal.SIGKILL)
        await wait_until(lambda: replicas_of(core)[0].state.value == "restarting", 5)
        await wait_until(lambda: replicas_of(core)[0].state.value == "ready", 60)
        fresh = replicas_of(core)[0]
        new_server = parent_of(fresh.pid)
        assert new_server != server and is_model_server(new_server, tiny_model_dir)
        assert (await embeddings(core))[0] == worker.id
    assert wait_gone([fresh.pid, new_server], 10) == []
    assert sink.named("model_server_unavailable") == []


async def test_a_model_server_that_cannot_load_means_the_routers_fork_server_forks(
    tiny_model_dir, tmp_path, monkeypatch
):
    real_key = forked.model_key

    def missing_artifact(argv):  # the server loads a model that is not there; workers don't
        key = list(real_key(argv))
        key[key.index("--artifact") + 1] = str(tmp_path / "no-such-model")
        return tuple(key)

    monkeypatch.setattr(forked, "model_key", missing_artifact)
    sink = RecordingSink()
    async with open_router(
        onednn_config(tiny_model_dir, 1), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        worker = replicas_of(core)[0]
        base = parent_of(worker.pid)
        assert "--control-fd" in cmdline(base) and base != os.getpid()
        assert (await embeddings(core))[0] == worker.id
        os.kill(worker.pid, signal.SIGKILL)
        await wait_until(lambda: replicas_of(core)[0].restarts == 1, 5)
        await wait_until(lambda: replicas_of(core)[0].state.value == "ready", 60)
        assert parent_of(replicas_of(core)[0].pid) == base
    first, again = sink.named("model_server_unavailable")
    assert first["fallback"] == "fork_server" and "did not start" in first["reason"]
    assert "no-such-model" in first["reason"]
    assert again["reason"] == first["reason"]  # remembered: the restart loaded nothing
    assert sink.named("fork_server_unavailable") == []


async def test_a_retired_or_changed_models_server_exits(tiny_model_dir, tmp_path):
    cfg = onednn_config(tiny_model_dir, 1)
    cfg.deployments["other"] = Deployment(
        artifact=str(tiny_model_dir), replicas=[Replica(device="cpu")]
    )
    async with open_router(cfg, threads=1, run_dir=tmp_path / "run") as core:
        await core.wait_ready(60)
        await wait_until(lambda: replicas_of(core, "other")[0].ready, 60)
        tiny_server = parent_of(replicas_of(core)[0].pid)
        other_server = parent_of(replicas_of(core, "other")[0].pid)
        # one server per model: the kernel asked for makes another model
        assert tiny_server != other_server
        assert is_model_server(tiny_server, tiny_model_dir)
        assert is_model_server(other_server, tiny_model_dir)

        changed = SrConfig()
        changed.deployments["other"] = attrs.evolve(cfg.deployments["other"], max_num_seqs=8)
        await core.reload(changed, timeout_s=30)
        await wait_until(lambda: replicas_of(core, "other")[0].ready, 60)
        assert "tiny" not in core.inventory().deployments
        # (waited on in Trio: wait_gone would block the router's own loop)
        await wait_until(lambda: not pid_alive(tiny_server), 10)  # retired with its deployment
        changed_server = parent_of(replicas_of(core, "other")[0].pid)
        assert changed_server != other_server and is_model_server(changed_server, tiny_model_dir)
        await wait_until(lambda: not pid_alive(other_server), 10)  # a changed model: a new server


def test_a_killed_router_takes_model_servers_and_workers_with_it(tiny_model_dir, tmp_path):
    process = ServeProcess(
        tmp_path, serve_config(tiny_model_dir, 2), env={forked.START_ENV: "fork"}
    )
    process.start()
    try:
        workers = [row["pid"] for row in process.replicas()]
        [server] = {parent_of(pid) for pid in workers}
        base = parent_of(server)
        assert is_model_server(server, tiny_model_dir) and base != process.proc.pid
        process.signal(signal.SIGKILL)
        process.wait(10)
        assert wait_gone([*workers, server, base], 10) == []
    finally:
        process.stop()


def test_the_model_server_measures_the_one_thread_cut_offs_before_forking(tiny_model_dir):
    """Measuring a cut-off makes a oneDNN primitive per row count (sr.models.gemm_rows):
    made before the fork, replicas at 1 thread share them instead of each keeping its own."""
    script = (
        "import sys\n"
        "from sr.models import gemm_rows\n"
        "from sr.worker import model_server\n"
        "model_server.preload(sys.argv[1:])\n"
        "print(sorted({(key[1], key[4]) for key in gemm_rows._cut_offs}))\n"
    )
    argv = [sys.executable, "-m", "sr", "worker", "--artifact", str(tiny_model_dir)]
    # In the fork server's environment: numpy's OpenBLAS at one thread. Without it, its pool
    # is a second thread until a fork shuts it down (OpenBLAS's fork handler), which only
    # the kernel probe's child did, and a probe answer kept from an earlier start skips.
    env = {**os.environ, **fork_start.SERVER_ONLY_ENV}
    done = subprocess.run(
        [sys.executable, "-c", script, *argv, "--kernel", "onednn"],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    assert done.stdout.strip() == "[(1, 'onednn')]"


@pytest.mark.parametrize("answer", ["onednn", "blas"])
def test_a_first_start_loads_again_only_where_the_probe_overrules_its_guess(answer, tmp_path):
    """The model is loaded on oneDNN while the probe's child runs (here a stand-in that
    answers `answer`): kept when the probe agrees, the card giving the probe's reason;
    loaded a second time on BLAS when it does not."""
    script = (
        "import json, sys\n"
        "from sr.models import linear\n"
        "from sr.worker import model_server\n"
        "class Probe:\n"
        "    def __init__(self, device, dtype, threads): pass\n"
        "    def wait(self): return linear.KernelChoice(sys.argv[1], 'the probe answered')\n"
        "model_server._ProbeChild.start = Probe\n"
        "loads, load = [], model_server.load_from_artifact\n"
        "model_server.load_from_artifact = lambda options: loads.append(1) or load(options)\n"
        "ready = model_server.preload(sys.argv[2:])\n"
        "print(json.dumps({'kernel': ready['kernel'], 'loads': len(loads)}))\n"
    )
    argv = [sys.executable, "-m", "sr", "worker", "--artifact", EMBEDDED_DEFAULT]
    env = {**os.environ, **fork_start.SERVER_ONLY_ENV, "SR_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script, answer, *argv],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    ready = json.loads(done.stdout.strip().splitlines()[-1])
    assert ready == {
        "kernel": {"linear": answer, "reason": "the probe answered"},
        "loads": 1 if answer == "onednn" else 2,
    }


def test_the_preload_imports_with_the_collector_off_and_leaves_it_on(monkeypatch, tmp_path):
    for name in ("sr_preload_probe_a", "sr_preload_probe_b"):  # each notes the collector
        (tmp_path / f"{name}.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(forkserver, "PRELOAD", ("sr_preload_probe_a", "sr_preload_probe_b"))
    try:
        failure = forkserver.import_preloaded()
    finally:
        frozen = gc.get_freeze_count()
        gc.unfreeze()
    assert failure is None
    assert [sys.modules[name].COLLECTING for name in forkserver.PRELOAD] == [False, False]
    assert gc.isenabled() and frozen > 0


def test_a_failed_preload_import_is_reported_and_the_collector_left_on(monkeypatch):
    monkeypatch.setattr(forkserver, "PRELOAD", ("json", "sr.no_such_module"))
    try:
        failure = forkserver.import_preloaded()
    finally:
        gc.unfreeze()
    assert failure is not None and failure.startswith("cannot import sr.no_such_module: ")
    assert gc.isenabled()
