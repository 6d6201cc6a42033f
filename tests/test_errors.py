"""RequestError.answer: the one writer of an error's answer (status, head, body)."""

from __future__ import annotations

import json

from sr.errors import JSON_CONTENT_TYPE, InvalidApiKey, MethodNotAllowed, Overloaded
from sr.http.driver import error_answer
from sr.worker.auth import unauthorized


def test_the_head_is_json_then_the_errors_own_headers_lower_case():
    status, head, body = Overloaded("busy", retry_after_s=3).answer()
    assert status == 503
    assert head == [JSON_CONTENT_TYPE, (b"retry-after", b"3")]
    assert json.loads(body)["error"]["code"] == "overloaded"


def test_the_server_and_the_worker_write_errors_through_it():
    error = MethodNotAllowed("use POST", headers={"Allow": "POST"})
    assert error_answer(error) == error.answer()
    status, head, _ = unauthorized()
    expected = InvalidApiKey("x", headers={"WWW-Authenticate": "Bearer"}).answer()
    assert (status, head) == expected[:2]
    assert head[-1] == (b"www-authenticate", b"Bearer")
