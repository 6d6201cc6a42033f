"""What one router-to-worker hop carries besides a request's method, path and body.

`Hop` travels from the pool's dispatch through a transport to the wire (sr.http.client
writes each set field as a header) or, in process, straight to the worker's handler:
* `request_id` — the router's request id (visible ASCII, checked by its front end), sent as
  `x-request-id`, so the worker's log lines and error bodies carry it;
* `deployment` — the deployment the worker is served as (a config-checked name), sent as
  `x-sr-deployment` for the worker's `model` check (sr.worker.served_as);
* `traceparent` — the W3C trace context of the router's hop span, only when traces are on.

A NamedTuple: one is built per dispatched request, and a tuple is the cheapest typed value
to build and to read.
"""

from __future__ import annotations

from typing import NamedTuple


class Hop(NamedTuple):
    request_id: str | None = None
    deployment: str | None = None
    traceparent: str | None = None


NO_HOP = Hop()  # a direct call: health probes, scrapes, fault posts
