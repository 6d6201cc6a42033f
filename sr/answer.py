"""An HTTP answer as every layer of sr hands one on: `(status, head fields, body)`.

The one shape of an answer between an app and the wire: the HTTP driver's handlers
(sr.http.driver) return one, the ASGI adapter sends one's parts, a worker's routes
(sr.worker.service) and the router's fronts (sr.router.front) build one, and
`RequestError.answer` (sr.errors) is the one writer of an error's. Head fields are
`(name, value)` byte pairs, names lower-case, in the order they are written.

A plain tuple, not a class: it is built once or more per request on the router's and the
worker's hot path, and a tuple costs no Python call to build or to unpack.
"""

from __future__ import annotations

HeadFields = list[tuple[bytes, bytes]]
Answer = tuple[int, HeadFields, bytes]

JSON_CONTENT_TYPE = (b"content-type", b"application/json")
