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


def test_the_asgi_adapter_and_the_native_front_send_the_same_answer():
    import trio

    from sr.http.asgi import send_error
    from sr.router.front import NativeFront

    error = Overloaded("busy", retry_after_s=2)
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    trio.run(send_error, send, error)
    status, head, body = error.answer()
    assert sent[0]["status"] == status
    # the answer's head whole, then its length (the ASGI server frames the body by it)
    assert sent[0]["headers"] == [*head, (b"content-length", str(len(body)).encode())]
    assert sent[1]["body"] == body
    assert NativeFront("/v1/embeddings").error(error) == error.answer()


def test_a_subclass_is_one_class_line_and_inherits_what_it_does_not_say():
    from sr.errors import EmptyInput, InvalidRequest, ReloadInProgress, ReloadRejected

    assert (ReloadRejected.status, ReloadRejected.code) == (409, "reload_failed")
    assert (ReloadInProgress.status, ReloadInProgress.code) == (409, "reload_in_progress")
    assert (EmptyInput.status, EmptyInput.code) == (400, "invalid_request")
    assert EmptyInput.names_field and InvalidRequest.names_field
    assert EmptyInput("input[2]: empty").param == "input[2]"
