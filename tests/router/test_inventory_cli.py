"""`sr inventory`: table rendering, colour only on request, errors, watch + Ctrl-C."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from sr.config.load import dump_config
from sr.config.schema import default_config
from sr.pool.views import Inventory, inventory_from_json, inventory_json
from sr.router import inventory_cli
from sr.router.inventory_table import render_inventory

# What a router answers (GET /api/v1/inventory/model-runtime), as JSON.
INVENTORY_JSON = {
    "ready": True,
    "deployments": {
        "primary": {
            "artifact": "/models/primary",
            "desired_replicas": 2,
            "ready_replicas": 1,
            "state": "degraded",
            "restarts": 3,
            "replicas": [
                {"id": "primary-0", "device": "cpu", "endpoint": None, "state": "ready",
                 "ready": True, "inflight": 4, "outstanding_bytes": 812, "restarts": 0,
                 "consecutive_timeouts": 0, "ejections": 0, "threads": 2, "pid": 101,
                 "reason": None},
                {"id": "primary-1", "device": "cpu", "endpoint": None, "state": "ejected",
                 "ready": False, "inflight": 0, "outstanding_bytes": 0, "restarts": 3,
                 "consecutive_timeouts": 3, "ejections": 1, "threads": 2, "pid": 102,
                 "reason": "3 consecutive timeouts", "ejected_for_ms": 29000},
            ],
        }
    },
}  # fmt: skip
INVENTORY = inventory_from_json(INVENTORY_JSON)


def test_the_json_reads_into_the_views_and_back_unchanged():
    assert inventory_json(INVENTORY) == INVENTORY_JSON
    assert json.dumps(inventory_json(INVENTORY)) == json.dumps(INVENTORY_JSON)


def test_table_lists_every_replica_with_its_numbers():
    lines = render_inventory(INVENTORY)
    assert lines[0] == "primary: degraded 1/2 ready, 3 restarts"
    header = lines[2].split()
    assert header[:4] == ["DEPLOYMENT", "REPLICA", "PLACEMENT", "STATE"]
    first, second = lines[3].split(), lines[4].split()
    assert first == ["primary", "primary-0", "cpu", "ready", "4", "812", "0", "0", "2", "-"]
    assert second[:5] == ["primary", "primary-1", "cpu", "ejected", "29s"]
    assert lines[4].endswith("3 consecutive timeouts")
    assert "\x1b[" not in "\n".join(lines)


def test_colour_marks_states_without_breaking_columns():
    plain = render_inventory(INVENTORY)
    coloured = render_inventory(INVENTORY, colour_states=True)
    assert "\x1b[32mready\x1b[0m" in coloured[3]
    assert "\x1b[31mejected\x1b[0m" in coloured[4]
    strip = [line.replace("\x1b[32m", "").replace("\x1b[31m", "").replace("\x1b[33m", "")
             .replace("\x1b[0m", "") for line in coloured]  # fmt: skip
    assert strip == plain


def test_empty_inventory():
    assert render_inventory(Inventory(ready=False, deployments={}))[0] == "no deployments"


def test_connection_refused_is_one_line_exit_1(capsys):
    assert inventory_cli.main(["--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "cannot connect to http://127.0.0.1:9" in err


class _InventoryHandler(BaseHTTPRequestHandler):
    """Answers like a router that has an API key set."""

    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer k"
        status, body = (200, json.dumps(self.server.answer)) if ok else (401, '{"error":{}}')
        payload = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def inventory_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _InventoryHandler)
    server.answer = INVENTORY_JSON  # what GET answers; a test may replace it
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(5)


@pytest.fixture
def inventory_url(inventory_server):
    return f"http://127.0.0.1:{inventory_server.server_address[1]}"


def test_prints_table_with_api_key_and_refuses_without(inventory_url, capsys):
    assert inventory_cli.main(["--url", inventory_url]) == 1
    assert "needs an API key" in capsys.readouterr().err
    assert inventory_cli.main(["--url", inventory_url, "--api-key", "k"]) == 0
    out = capsys.readouterr().out
    assert "primary-1" in out
    assert "\x1b[" not in out  # captured stdout is not a tty


def _replica(answer, index):
    return answer["deployments"]["primary"]["replicas"][index]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda a: _replica(a, 0).pop("state"), "replicas[0].state: required field missing"),
        (lambda a: _replica(a, 1).update(inflight="0"), "replicas[1].inflight: expected int"),
        (lambda a: _replica(a, 1).update(state="asleep"), "replicas[1].state: expected one of"),
        (lambda a: a["deployments"]["primary"].update(replicas={}), "replicas: expected a list"),
        (lambda a: a.update(deployments=[]), "inventory.deployments: expected an object"),
        (lambda a: a.clear(), "inventory.ready: required field missing"),
    ],
)
def test_an_answer_of_another_shape_is_one_line_naming_the_field_exit_1(
    inventory_server, inventory_url, capsys, change, named
):
    answer = copy.deepcopy(INVENTORY_JSON)
    change(answer)
    inventory_server.answer = answer
    assert inventory_cli.main(["--url", inventory_url, "--api-key", "k"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and captured.out == ""
    assert "did not answer an inventory this sr reads: " in lines[0]
    assert named in lines[0]


def test_fields_a_newer_router_adds_are_ignored(inventory_server, inventory_url, capsys):
    answer = copy.deepcopy(INVENTORY_JSON)
    answer["deployments"]["primary"]["replicas"][0]["queue_depth"] = 7
    answer["uptime_s"] = 12
    inventory_server.answer = answer
    assert inventory_cli.main(["--url", inventory_url, "--api-key", "k"]) == 0
    assert capsys.readouterr().out.splitlines() == render_inventory(INVENTORY)


def test_watch_redraws_until_ctrl_c(inventory_url, capsys, monkeypatch):
    sleeps = []

    def fake_sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(inventory_cli.time, "sleep", fake_sleep)
    argv = ["--url", inventory_url, "--api-key", "k", "--watch", "--interval", "0.5"]
    assert inventory_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count(inventory_cli.CLEAR_SCREEN) == 2
    assert sleeps == [0.5, 0.5]


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--interval", "nan", "--watch"],
        ["--interval", "0"],
        ["--interval", "-1"],
        ["--url", "notaurl"],
        ["--url", "ftp://127.0.0.1:1"],
    ],
)
def test_usage_errors_are_one_line_exit_2(argv, capsys):
    assert inventory_cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sr inventory: error: ")
    assert captured.out == ""


# -- which router: --url, else the listener of --config ----------------------------------
def _config_with_listeners(path, listeners):
    """The default config with these (host, port) listeners; none: no `listeners` key."""
    config = yaml.safe_load(dump_config(default_config()))
    config.pop("listeners")
    if listeners:
        config["listeners"] = [{"host": host, "port": port} for host, port in listeners]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("listeners", "url"),
    [
        ([("10.1.2.3", 9001)], "http://10.1.2.3:9001"),
        ([("0.0.0.0", 9003)], "http://127.0.0.1:9003"),  # every address: ask on loopback
        ([("::", 9004)], "http://[::1]:9004"),
        ([("fd00::7", 9005)], "http://[fd00::7]:9005"),
        ([], "http://127.0.0.1:8899"),  # sr serve's default listener
    ],
)
def test_the_url_comes_from_the_config_listener(tmp_path, listeners, url):
    path = _config_with_listeners(tmp_path / "c.yaml", listeners)
    assert inventory_cli.router_url(None, str(path)) == url
    assert inventory_cli.router_url("http://h:1", str(path)) == "http://h:1"  # --url wins


def test_without_flags_the_config_in_the_working_folder_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert inventory_cli.router_url(None, None) == "http://127.0.0.1:8899"  # none here
    _config_with_listeners(tmp_path / "config.yaml", [("127.0.0.1", 9010)])
    assert inventory_cli.router_url(None, None) == "http://127.0.0.1:9010"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "no config at {path}"),
        ("global: {nonsense: 1}\n", "{path}: "),
        ("a: [\n", "{path}:"),
    ],
    ids=["missing", "invalid", "not yaml"],
)
def test_a_config_that_cannot_name_the_router_is_one_line_exit_2(tmp_path, capsys, text, expected):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    assert inventory_cli.main(["--config", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and captured.out == ""
    assert lines[0].startswith("sr inventory: error: " + expected.format(path=path))
    assert "Traceback" not in captured.err


def test_a_listener_on_port_0_cannot_be_asked(tmp_path, capsys):
    path = _config_with_listeners(tmp_path / "c.yaml", [("127.0.0.1", 0)])
    assert inventory_cli.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"sr inventory: error: {path}: the listener's port is 0 (picked at start); give --url\n"
    )


# -- --watch across router restarts -------------------------------------------------------
class _Restartable:
    """A fake router on one fixed port that can go away and come back."""

    def __init__(self) -> None:
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.start(0)
        self.port = self.server.server_address[1]

    def start(self, port: int | None = None) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port if port is None else port),
                                          _InventoryHandler)  # fmt: skip
        self.server.answer = INVENTORY_JSON
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)
            self.server = None


def test_watch_waits_while_the_router_is_away_and_resumes(capsys, monkeypatch):
    router = _Restartable()
    router.stop()  # not up yet when the watch begins
    url = f"http://127.0.0.1:{router.port}"
    script = [router.start, router.stop, router.start]
    sleeps = []

    def fake_sleep(seconds):
        sleeps.append(seconds)
        if not script:
            raise KeyboardInterrupt
        script.pop(0)()

    monkeypatch.setattr(inventory_cli.time, "sleep", fake_sleep)
    try:
        argv = ["--url", url, "--api-key", "k", "--watch", "--interval", "0.01"]
        assert inventory_cli.main(argv) == 0
    finally:
        router.stop()
    screens = capsys.readouterr().out.split(inventory_cli.CLEAR_SCREEN)[1:]
    assert len(screens) == 4 and sleeps == [0.01] * 4
    bodies = [screen.split("\n\n", 1)[1] for screen in screens]
    assert [body.startswith(f"waiting for {url} (not listening)") for body in bodies] == [
        True,
        False,
        True,
        False,
    ]
    assert "primary-1" in bodies[1] and "primary-1" in bodies[3]


def test_watch_still_stops_on_an_answer_waiting_will_not_fix(inventory_url, capsys, monkeypatch):
    monkeypatch.setattr(inventory_cli.time, "sleep", lambda s: None)
    assert inventory_cli.main(["--url", inventory_url, "--watch"]) == 1  # no API key
    assert "needs an API key" in capsys.readouterr().err
