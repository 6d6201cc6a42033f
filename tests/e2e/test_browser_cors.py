"""CORS in a real browser: headless Chromium loads a page from an allowed origin that calls
`sr serve` with `fetch`, an API key and a JSON body (so the browser sends a preflight first),
and the page reports what it read; a page from an origin not allowed cannot read anything.
Pages are served on 127.0.0.2 and 127.0.0.3, other loopback hosts and so other origins."""

from __future__ import annotations

import http.server
import json
import queue
import shutil
import subprocess
import threading

import pytest

from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = "browser-key"
PAGE = """<!doctype html><meta charset="utf-8"><title>sr cors</title><script>
fetch(%(sr)s + "/v1/embeddings", {
  method: "POST",
  headers: {"Authorization": "Bearer %(key)s", "Content-Type": "application/json"},
  body: JSON.stringify({model: "primary", input: "hello from a page"}),
}).then(async r => {
  const answer = await r.json();
  return {read: true, status: r.status, dims: answer.data[0].embedding.length,
          request_id: r.headers.get("x-request-id")};
}).catch(e => ({read: false, error: String(e)}))
  .then(result => fetch("/report", {method: "POST", body: JSON.stringify(result)}));
</script>"""


class _PageServer:
    """Serves PAGE at / on `host` and takes the page's one report at POST /report."""

    def __init__(self, host: str, sr_url: str) -> None:
        self.reports: queue.Queue = queue.Queue()
        page = (PAGE % {"sr": json.dumps(sr_url), "key": KEY}).encode()
        reports = self.reports

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/" else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                reports.put(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _visit(url: str, profile, pages: _PageServer, timeout_s: float = 30) -> dict:
    """Open `url` in headless Chromium and wait for the page's report."""
    browser = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--disable-background-networking",
         f"--user-data-dir={profile}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        return pages.reports.get(timeout=timeout_s)
    finally:
        browser.kill()
        browser.wait(10)


@pytest.fixture(scope="module")
def pages_and_server(tmp_path_factory, tiny_model_dir):
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install chromium)")
    process = ServeProcess(  # its URL is known already: the pages can name it
        tmp_path_factory.mktemp("browser"), headers={"Authorization": f"Bearer {KEY}"}
    )
    allowed = _PageServer("127.0.0.2", process.url)
    other = _PageServer("127.0.0.3", process.url)
    config = serve_config(tiny_model_dir, 1, api_keys=[KEY])
    config["listeners"][0]["cors_allow_origins"] = [allowed.url]
    process.configure(config)
    try:
        process.start(timeout_s=40)
        yield allowed, other, tmp_path_factory
    finally:
        allowed.close()
        other.close()
        process.stop()


def test_a_page_from_an_allowed_origin_reads_the_answer(pages_and_server):
    """The preflight (Authorization and a JSON body) and the POST both pass the browser's
    checks, one Access-Control-Allow-Origin each, and the page reads the embedding."""
    allowed, _, tmp = pages_and_server
    report = _visit(allowed.url + "/", tmp.mktemp("profile-allowed"), allowed)
    assert report["read"] is True, report
    assert (report["status"], report["dims"]) == (200, 32)
    assert report["request_id"]  # an exposed header the page can read


def test_a_page_from_another_origin_reads_nothing(pages_and_server):
    _, other, tmp = pages_and_server
    report = _visit(other.url + "/", tmp.mktemp("profile-other"), other)
    assert report["read"] is False, report
    assert "Failed to fetch" in report["error"]
