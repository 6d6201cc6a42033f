"""Discovered fleets (sr.pool.discovery) through Supervisor, under a mock clock: fake
attached workers in process, a resolver the test controls."""

from __future__ import annotations

import itertools
import json

import pytest
import trio
import trio.testing

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.http.hop import NO_HOP
from sr.pool import ReloadFailed, StartupFailed, open_router
from sr.pool.discovery import DnsResolver
from sr.pool.transport import InProcessTransport, TransportError
from sr.pool.views import DeploymentView
from sr.router.inventory_table import render_inventory

ARTIFACT = "/models/tiny"
NAME = "workers.test"
PORT = 8100
REFRESH_S = 10
A1, A2, A3 = ("10.0.0.1", PORT), ("10.0.0.2", PORT), ("10.0.0.3", PORT)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class FakeAttached:
    """One attached worker: `health` ready/loading/down, `artifact` on its card, `mode`
    ok/die for requests, `hold` (an Event) keeps requests waiting until set."""

    def __init__(self) -> None:
        self.health = "ready"
        self.artifact = ARTIFACT
        self.mode = "ok"
        self.hold: trio.Event | None = None
        self.served = 0
        self.waiting = 0

    async def handle(self, method, path, body, hop=NO_HOP):
        headers = [(b"content-type", b"application/json")]
        if self.health == "down":
            raise TransportError("connection refused")
        if path == "/health":
            if self.health == "ready":
                return 200, headers, b'{"status":"ready"}'
            return 503, headers, json.dumps({"status": self.health, "reason": "x"}).encode()
        if path == "/v1/models":
            card = {"id": self.artifact, "threads": 1, "limits": {}}
            return 200, headers, json.dumps({"object": "list", "data": [card]}).encode()
        if self.mode == "die":
            raise TransportError("connection reset by peer")
        if self.hold is not None:
            self.waiting += 1
            await self.hold.wait()
            self.waiting -= 1
        self.served += 1
        return 200, headers, b'{"ok": true}'


class Fleet(dict):
    """url -> FakeAttached, created on first use; `fleet[A1]` by address too."""

    def __missing__(self, key):
        url = key if isinstance(key, str) else f"http://{key[0]}:{key[1]}"
        if url not in self.keys():
            dict.__setitem__(self, url, FakeAttached())
        return dict.__getitem__(self, url)

    def connect(self, url: str) -> InProcessTransport:
        return InProcessTransport(self[url])


class FakeResolver:
    def __init__(self, *answer) -> None:
        self.answer = list(answer)
        self.error: Exception | None = None
        self.calls: list[float] = []

    async def resolve(self, host: str, port: int):
        assert (host, port) == (NAME, PORT)
        self.calls.append(trio.current_time())
        if self.error is not None:
            raise self.error
        return list(self.answer)


def discovered_config(**fields) -> SrConfig:
    entry = Replica(discover=f"dns://{NAME}:{PORT}", model=ARTIFACT, refresh_s=REFRESH_S, **fields)
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(artifact=ARTIFACT, replicas=[entry])
    return cfg


def router(cfg, fleet, resolver, tmp_path, sink=None):
    return open_router(
        cfg,
        events=sink or RecordingSink(),
        threads=1,
        run_dir=tmp_path / "run",
        resolver=resolver,
        connect_endpoint=fleet.connect,
    )


def view(core) -> DeploymentView:
    return core.inventory().deployments["primary"]


def statuses(core) -> dict[str, str]:
    (entry,) = view(core).discovery
    return {row.address: row.status for row in entry.discovered}


def endpoints(core) -> list[str]:
    return sorted(row.endpoint for row in view(core).replicas)


async def embed(core):
    return await core.request("primary", "/v1/embeddings", {"input": "x"})


async def test_an_address_joins_only_after_its_health_and_card_checks(tmp_path, autojump_clock):
    fleet, sink = Fleet(), RecordingSink()
    fleet[A2].health = "loading"
    fleet[A3].artifact = "/models/other"  # a worker serving something else never joins
    resolver = FakeResolver(A1, A2, A3)
    async with router(discovered_config(), fleet, resolver, tmp_path, sink) as core:
        await core.wait_ready(5)
        await trio.sleep(1)
        assert endpoints(core) == ["http://10.0.0.1:8100"]
        assert statuses(core) == {
            "10.0.0.1:8100": "member",
            "10.0.0.2:8100": "joining",
            "10.0.0.3:8100": "joining",
        }
        inv = view(core)
        assert (inv.desired_replicas, inv.ready_replicas, inv.state) == (3, 1, "degraded")
        for _ in range(4):
            await embed(core)
        assert (fleet[A1].served, fleet[A2].served, fleet[A3].served) == (4, 0, 0)

        fleet[A2].health = "ready"
        await trio.sleep(2)
        assert endpoints(core) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
        assert statuses(core)["10.0.0.2:8100"] == "member"
        assert statuses(core)["10.0.0.3:8100"] == "joining"
        joined = [e["address"] for e in sink.named("discovered_replica_joined")]
        assert joined == ["10.0.0.1:8100", "10.0.0.2:8100"]
        for _ in range(4):
            await embed(core)
        assert fleet[A2].served == 2 and fleet[A3].served == 0  # least outstanding, LRA ties
        assert len(resolver.calls) == 1  # nothing asked for another resolution yet


async def test_the_same_set_again_changes_nothing(tmp_path, autojump_clock):
    fleet, sink = Fleet(), RecordingSink()
    resolver = FakeResolver(A1, A2)
    async with router(discovered_config(), fleet, resolver, tmp_path, sink) as core:
        await core.wait_ready(5)
        await trio.sleep(1)
        before = dict(core.pools["primary"].runners)
        resolver.answer = [A2, A1, A2]  # other order, a repeat
        await trio.sleep(3 * REFRESH_S)
        assert len(resolver.calls) == 4  # at 0, 10, 20, 30
        after = core.pools["primary"].runners
        assert after.keys() == before.keys()
        assert all(after[key] is runner for key, runner in before.items())  # same tasks
        assert len(sink.named("discovery_changed")) == 1  # the first resolution only
        (entry,) = view(core).discovery
        assert entry.last_resolution.count == 2 and entry.last_resolution.error is None


async def test_a_failed_resolution_keeps_the_last_good_set_and_says_so(tmp_path, autojump_clock):
    fleet, sink = Fleet(), RecordingSink()
    resolver = FakeResolver(A1, A2)
    async with router(discovered_config(), fleet, resolver, tmp_path, sink) as core:
        await core.wait_ready(5)
        await trio.sleep(1)
        members = endpoints(core)
        good = len(resolver.calls)
        resolver.error = OSError(-2, "Name or service not known")
        await trio.sleep(REFRESH_S)  # the refresh fails
        assert endpoints(core) == members
        (entry,) = view(core).discovery
        assert "Name or service not known" in entry.last_resolution.error
        assert entry.last_good_resolution.count == 2
        assert entry.last_good_resolution.error is None
        assert set(statuses(core).values()) == {"member"}
        assert (await embed(core))["ok"] is True
        assert sink.named("discovery_failed")[-1]["kept"] == 2
        # failures are retried after 1 s, doubling (not every refresh_s, not in a loop)
        await trio.sleep(7.5)
        failed = resolver.calls[good:]
        assert [b - a for a, b in itertools.pairwise(failed)] == [1, 2, 4]

        table = "\n".join(render_inventory(core.inventory()))
        assert f"  discover dns://{NAME}:{PORT}: 2/2 joined; resolved 2s ago (" in table
        assert "address(es): FAILED OSError: [Errno -2] Name or service not known" in table
        assert ", keeping the set of " in table

        resolver.error = None
        resolver.answer = []  # an empty answer is a failure too: the set stays
        await trio.sleep(7)  # the next retry, 8 s after the last
        (entry,) = view(core).discovery
        assert entry.last_resolution.error == "resolved to no address"
        assert endpoints(core) == members

        resolver.answer = [("10.0.0.1", "not a port")]  # a resolver's malformed answer
        await trio.sleep(REFRESH_S)  # retries are capped at refresh_s
        (entry,) = view(core).discovery
        assert entry.last_resolution.error.startswith("ValueError: invalid literal")
        assert endpoints(core) == members

        resolver.answer = [A1, A2]
        await trio.sleep(REFRESH_S)
        (entry,) = view(core).discovery
        assert entry.last_resolution.error is None


async def test_a_vanished_address_is_drained_then_forgotten(tmp_path, autojump_clock):
    fleet, sink = Fleet(), RecordingSink()
    fleet[A2].hold = trio.Event()
    resolver = FakeResolver(A1, A2)
    async with router(discovered_config(), fleet, resolver, tmp_path, sink) as core:
        await core.wait_ready(5)
        await trio.sleep(1)
        answers = []

        async def one() -> None:
            answers.append(await embed(core))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)  # one request on each replica
            await trio.sleep(0.1)
            assert fleet[A2].waiting == 1

            resolver.answer = [A1]
            await trio.sleep(REFRESH_S)
            assert statuses(core) == {"10.0.0.1:8100": "member", "10.0.0.2:8100": "leaving"}
            row = next(r for r in view(core).replicas if r.endpoint.endswith("0.2:8100"))
            assert (row.state.value, row.inflight) == ("draining", 1)
            for _ in range(3):  # new work goes to the address that stayed
                await embed(core)
            assert fleet[A2].served == 0
            fleet[A2].hold.set()  # the in-flight request finishes on the leaving replica
        assert len(answers) == 2 and fleet[A2].served == 1
        await trio.sleep(0.5)
        assert endpoints(core) == ["http://10.0.0.1:8100"]
        assert statuses(core) == {"10.0.0.1:8100": "member"}
        assert [e["address"] for e in sink.named("discovered_replica_leaving")] == ["10.0.0.2:8100"]


async def test_a_member_failure_re_resolves_soon_but_at_most_once_a_second(
    tmp_path, autojump_clock
):
    fleet = Fleet()
    resolver = FakeResolver(A1, A2)
    async with router(discovered_config(), fleet, resolver, tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1.5)
        assert len(resolver.calls) == 1
        fleet[A1].mode = "die"
        start = trio.current_time()
        for _ in range(30):  # 3 s of requests; every one on A1 fails (and is retried on A2)
            assert (await embed(core))["ok"] is True
            await trio.sleep(0.1)
        extra = [t - start for t in resolver.calls[1:]]
        assert extra and extra[0] < 1.0  # soon, not after refresh_s
        assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(extra))
        assert len(extra) <= 4


async def test_reload_warms_a_new_entry_first_and_fails_when_it_cannot_resolve(
    tmp_path, autojump_clock
):
    fleet = Fleet()
    resolver = FakeResolver(A1)
    static = SrConfig()
    static.deployments["primary"] = Deployment(
        artifact=ARTIFACT, replicas=[Replica(endpoint="http://10.0.0.9:8100", model=ARTIFACT)]
    )
    async with router(static, fleet, resolver, tmp_path) as core:
        await core.wait_ready(5)
        resolver.error = OSError("no such name")
        with pytest.raises(ReloadFailed, match=r"old config still serving.*no such name"):
            await core.reload(discovered_config(), timeout_s=5)
        assert endpoints(core) == ["http://10.0.0.9:8100"]
        assert view(core).discovery is None

        resolver.error = None
        fleet[A1].health = "loading"

        async def ready_later() -> None:
            await trio.sleep(2)
            fleet[A1].health = "ready"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ready_later)
            await core.reload(discovered_config(), timeout_s=5)
            # published only once warm: the discovered worker already serves
            assert endpoints(core) == ["http://10.0.0.1:8100"]
        await trio.sleep(0.5)
        assert statuses(core) == {"10.0.0.1:8100": "member"}


class SlowResolver(FakeResolver):
    """Answers after `delay_s`: members then start off the reload's own time grid."""

    delay_s = 0.0123

    async def resolve(self, host: str, port: int):
        await trio.sleep(self.delay_s)
        return await super().resolve(host, port)


async def test_reload_warm_up_ends_at_the_instant_the_last_address_joins(tmp_path, autojump_clock):
    fleet, sink = Fleet(), RecordingSink()
    resolver = SlowResolver(A1, A2)
    static = SrConfig()
    static.deployments["primary"] = Deployment(
        artifact=ARTIFACT, replicas=[Replica(endpoint="http://10.0.0.9:8100", model=ARTIFACT)]
    )
    joined_at: dict[str, float] = {}
    sink.subscribe(
        lambda event, fields: (
            joined_at.setdefault(fields["address"], trio.current_time())
            if event == "discovered_replica_joined"
            else None
        )
    )
    async with router(static, fleet, resolver, tmp_path, sink) as core:
        await core.wait_ready(5)
        fleet[A2].health = "loading"

        async def ready_later() -> None:
            await trio.sleep(1.5)
            fleet[A2].health = "ready"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ready_later)
            await core.reload(discovered_config(), timeout_s=5)
            assert trio.current_time() == joined_at["10.0.0.2:8100"] > joined_at["10.0.0.1:8100"]
            ready_at = [r.record.restart.healthy_since for r in view_runners(core)]
            assert max(ready_at) == joined_at["10.0.0.2:8100"]  # joined as it turned ready


def view_runners(core):
    return core.pools["primary"].runners.values()


async def test_a_key_variable_that_is_not_set_fails_startup_naming_the_field(
    tmp_path, monkeypatch, autojump_clock
):
    monkeypatch.delenv("SR_TEST_WORKER_KEY", raising=False)
    cfg = discovered_config(api_key_env="SR_TEST_WORKER_KEY")
    with pytest.raises(StartupFailed) as caught:
        async with router(cfg, Fleet(), FakeResolver(A1), tmp_path):
            pass
    assert str(caught.value).startswith(
        "global.model_catalog.deployments.primary.replicas[0].api_key_env:"
        " the environment variable SR_TEST_WORKER_KEY is not set"
    )


async def test_an_unreadable_ca_bundle_fails_startup_naming_the_field(tmp_path, autojump_clock):
    cfg = discovered_config(scheme="https", ca_bundle=str(tmp_path / "missing.pem"))
    with pytest.raises(StartupFailed, match=r"replicas\[0\]\.ca_bundle: cannot load"):
        async with router(cfg, Fleet(), FakeResolver(A1), tmp_path):
            pass


async def test_the_default_resolver_answers_addresses_with_the_port():
    assert await DnsResolver().resolve("127.0.0.3", 8100) == [("127.0.0.3", 8100)]
    assert await DnsResolver().resolve("::1", 9) == [("::1", 9)]


async def test_a_rotated_key_replaces_the_replicas_reached_with_it(
    tmp_path, monkeypatch, autojump_clock
):
    monkeypatch.setenv("SR_TEST_ROTATED_KEY", "first")
    fleet = Fleet()
    cfg = discovered_config(api_key_env="SR_TEST_ROTATED_KEY")
    static = Replica(endpoint="http://10.0.0.9:8100", model=ARTIFACT)
    static.api_key_env = "SR_TEST_ROTATED_KEY"
    cfg.deployments["primary"].replicas.append(static)
    async with router(cfg, fleet, FakeResolver(A1), tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1)
        pool = core.pools["primary"]
        before = dict(pool.runners)
        assert len(before) == 2

        await core.reload(cfg, timeout_s=5)  # same key: nothing is replaced
        assert all(pool.runners[rid] is runner for rid, runner in before.items())

        monkeypatch.setenv("SR_TEST_ROTATED_KEY", "second")
        await core.reload(cfg, timeout_s=5)
        await trio.sleep(1)
        (static_id,) = pool.static_runners
        assert static_id in before and pool.runners[static_id] is not before[static_id]
        assert before[static_id].record.retired  # the old transport's runner is gone
        (member_id,) = (rid for rid in pool.runners if rid != static_id)
        assert member_id not in before  # the discovered member was replaced too
        assert all(runner.record.retired for runner in before.values())
        assert sorted(endpoints(core)) == ["http://10.0.0.1:8100", "http://10.0.0.9:8100"]
