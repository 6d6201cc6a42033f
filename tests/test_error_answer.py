"""The one reader of a worker's error answer (sr.error_answer)."""

from __future__ import annotations

import pytest

from sr.error_answer import ErrorAnswer, read_error_answer
from sr.errors import InvalidRequest, Overloaded


def test_reads_what_request_error_writes():
    body = InvalidRequest("input[2]: must not be empty").body()
    assert read_error_answer(body) == ErrorAnswer(
        "input[2]: must not be empty", "invalid_request", "input[2]"
    )
    assert read_error_answer(Overloaded("busy").body()) == ErrorAnswer("busy", "overloaded")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "(empty body)"),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
        (b'{"error": "plain"}', '{"error": "plain"}'),
        (b'{"error": {"code": "x"}}', '{"error": {"code": "x"}}'),
        (b"[" * 100_000, "[" * 200),
        (b"\xff\xfe oops", "\ufffd\ufffd oops"),
    ],
)
def test_another_shape_is_its_own_text_cut_short(body, message):
    assert read_error_answer(body) == ErrorAnswer(message)


def test_code_and_param_only_as_strings():
    body = b'{"error": {"message": 7, "code": 500, "param": ["x"]}}'
    assert read_error_answer(body) == ErrorAnswer("7")
