"""Chaos harness: bounded load against an `sr serve` subprocess, checks and reports.

The process itself is `tests.serve_process.ServeProcess`.

Everything is loopback and bounded: every wait has a deadline, every request a client
timeout a little past its own deadline, so a hung request shows up as `lost`, never as a
hung test.
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

DOCUMENTED = {  # the error contract: each status -> the only error codes it may carry
    400: {"invalid_request"},
    401: {"invalid_api_key"},
    404: {"model_not_found"},
    413: {"request_too_large"},
    502: {"worker_failed"},
    503: {"overloaded", "unavailable"},
    504: {"timeout"},
}
CLIENT_SLACK_S = 3.0  # a request still unanswered this long past its deadline is lost


async def wait_until(
    check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05
) -> Any:
    """Poll an async `check` until it returns something truthy; AssertionError after timeout."""
    last = None
    with trio.move_on_after(timeout_s):
        while True:
            last = await check()
            if last:
                return last
            await trio.sleep(poll_s)
    raise AssertionError(f"not within {timeout_s}s: {what}; last: {last!r}")


# -- load ----------------------------------------------------------------------------------
@attrs.define
class Result:
    index: int
    started: float
    latency_s: float
    status: int | None  # None: no HTTP answer (lost)
    code: str  # "ok", the error code, or "lost:<why>"
    replica: str | None = None
    retry_after: str | None = None


def classify(answer: httpx.Response) -> str:
    if 200 <= answer.status_code < 300:
        return "ok"
    try:
        code = answer.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"malformed:{answer.status_code}"
    return str(code)


async def one_request(
    client: httpx.AsyncClient,
    index: int,
    *,
    deadline_ms: int | None,
    path: str = "/v1/embeddings",
    body: dict[str, Any] | None = None,
    client_timeout_s: float = 10.0,
) -> Result:
    payload = body or {"model": "primary", "input": [f"chaos request {index}", "second row"]}
    headers = {"X-Request-Timeout-Ms": str(deadline_ms)} if deadline_ms else {}
    started = time.monotonic()
    try:
        with trio.fail_after(client_timeout_s):
            answer = await client.post(path, json=payload, headers=headers)
    except trio.TooSlowError:
        return Result(index, started, time.monotonic() - started, None, "lost:hung")
    except httpx.HTTPError as error:
        why = f"lost:{type(error).__name__}"
        return Result(index, started, time.monotonic() - started, None, why)
    return Result(
        index,
        started,
        time.monotonic() - started,
        answer.status_code,
        classify(answer),
        answer.headers.get("x-sr-replica"),
        answer.headers.get("retry-after"),
    )


async def steady_load(
    client: httpx.AsyncClient,
    total: int,
    concurrency: int,
    *,
    deadline_ms: int | None,
    on_sent: Callable[[int], Any] | None = None,
    pace_s: float = 0.0,
    client_timeout_s: float = 10.0,
) -> list[Result]:
    """`total` requests through `concurrency` lanes; `on_sent(i)` may await a fault."""
    results: list[Result] = []
    counter = iter(range(total))

    async def lane() -> None:
        for index in counter:
            if on_sent is not None:
                await on_sent(index)
            results.append(
                await one_request(
                    client, index, deadline_ms=deadline_ms, client_timeout_s=client_timeout_s
                )
            )
            if pace_s:
                await trio.sleep(pace_s)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(lane)
    return sorted(results, key=lambda r: r.index)


def async_client(url: str, connections: int = 128, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(30.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        **kw,
    )


# -- checks and reports --------------------------------------------------------------------
def counts(results: Iterable[Result]) -> dict[str, int]:
    tally = collections.Counter(r.code for r in results)
    return dict(sorted(tally.items()))


def undocumented(results: Iterable[Result]) -> list[Result]:
    """Answers that are neither 2xx nor a documented (status, code) pair, or lost."""
    bad = []
    for r in results:
        if r.code == "ok" and r.status is not None and 200 <= r.status < 300:
            continue
        if r.status is not None and r.code in DOCUMENTED.get(r.status, ()):
            continue
        bad.append(r)
    return bad


def report(scenario: str, results: list[Result], **extra: Any) -> dict[str, Any]:
    """Print the tally and append one row to $SR_CHAOS_REPORT (a JSON list), if set."""
    tally = counts(results)
    lost = sum(n for code, n in tally.items() if code.startswith("lost"))
    row = {
        "scenario": scenario,
        "sent": len(results),
        "ok": tally.get("ok", 0),
        "errors": {k: v for k, v in tally.items() if k != "ok" and not k.startswith("lost")},
        "lost": lost,
        "max_latency_ms": round(max((r.latency_s for r in results), default=0) * 1000),
        **extra,
    }
    return write_report_row(row)


def write_report_row(row: dict[str, Any]) -> dict[str, Any]:
    """Print one scenario's row and put it in $SR_CHAOS_REPORT (a JSON list), if set."""
    scenario = row["scenario"]
    print(f"\nchaos[{scenario}] " + json.dumps(row, sort_keys=True))
    target = os.environ.get("SR_CHAOS_REPORT")
    if target:
        path = Path(target)
        rows = json.loads(path.read_text()) if path.exists() and path.stat().st_size else []
        rows = [r for r in rows if r.get("scenario") != scenario] + [row]
        path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return row
