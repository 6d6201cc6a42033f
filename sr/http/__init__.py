"""sr.http: sr's HTTP/1.1 stack, for the router's front door, the workers and the client
between them.

`connection` (the sans-I/O server connection: protocol state and transitions in one table),
`driver` (one connection's Trio loop around it), `server` (accepting, the connection cap,
graceful shutdown), `asgi_adapter` (the router's ASGI app on it), `parse` (llhttp through
httptools), `framing` (the one place that decides a body's framing), `wire` (answer
heads), `body` (the one request-body reader, capped in size and time), `sockio`, `hang_up`
(one poller per server), `limits`, `client` (the router-to-worker HTTP/1.1 client; its
failures are sr.errors.TransportError by phase), `private_folder` (Unix socket folders),
`asgi` (the router app's ASGI helpers) and `jsonbody` (the one JSON body parser, for the
router, the workers and the Python API).
"""
