"""sr.http: sr's HTTP/1.1 stack, for the router's front door, the workers and the client
between them.

`server` (the connection loop over trio streams), `asgi_adapter` (the router's ASGI app on
it), `parse` (llhttp through httptools), `framing`, `wire` (answer heads), `sockio`,
`hang_up` (one poller per server), `limits`, `client` (the router-to-worker HTTP/1.1 client),
`private_folder` (Unix socket folders), `asgi`, `jsonbody` and `request_id` (helpers both
sides share).
"""
