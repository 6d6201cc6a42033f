"""The official `openai` SDK against a real `sr serve` (tiny BERT, one worker): its default
base64 embeddings, `dimensions`, token-id input, models.retrieve/list, and errors whose
`type`, `param` and `code` the SDK exposes."""

from __future__ import annotations

import math

import openai
import pytest

from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

HELLO_WORLD_IDS = [7592, 2088]  # "hello world" in the MiniLM vocabulary, no [CLS]/[SEP]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    workdir = tmp_path_factory.mktemp("openai-sdk")
    process = ServeProcess(workdir, serve_config(tiny_model_dir, 1))
    process.artifact = str(tiny_model_dir)
    process.start(timeout_s=40)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def _norm(vector):
    return math.sqrt(math.fsum(x * x for x in vector))


def test_default_call_is_base64_and_decodes(client):
    answer = client.embeddings.create(model="primary", input=["hello world", "second"])
    assert answer.model == "primary"
    assert [d.index for d in answer.data] == [0, 1]
    assert all(len(d.embedding) == 32 for d in answer.data)
    assert math.isclose(_norm(answer.data[0].embedding), 1.0, rel_tol=1e-5)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0
    as_float = client.embeddings.create(
        model="primary", input="hello world", encoding_format="float"
    )
    assert as_float.data[0].embedding == pytest.approx(answer.data[0].embedding, rel=1e-6)


def test_dimensions(client):
    answer = client.embeddings.create(model="primary", input="hello world", dimensions=8)
    vector = answer.data[0].embedding
    assert len(vector) == 8
    assert math.isclose(_norm(vector), 1.0, rel_tol=1e-5)


def test_token_id_input_embeds_as_the_text(client):
    text = client.embeddings.create(model="primary", input=["hello world", "hello"])
    one = client.embeddings.create(model="primary", input=HELLO_WORLD_IDS)
    several = client.embeddings.create(model="primary", input=[HELLO_WORLD_IDS, [7592]])
    assert one.data[0].embedding == text.data[0].embedding
    assert [d.embedding for d in several.data] == [d.embedding for d in text.data]


def test_every_documented_field(client, server):
    answer = client.embeddings.create(
        model=server.artifact,
        input="hello",
        encoding_format="float",
        dimensions=4,
        user="user-1",
    )
    assert len(answer.data[0].embedding) == 4


def test_the_request_id_is_the_callers_or_a_new_one(client):
    raw = client.embeddings.with_raw_response.create(model="primary", input="hello")
    assert len(raw.headers["x-request-id"]) == 32
    mine = client.embeddings.with_raw_response.create(
        model="primary", input="hello again", extra_headers={"X-Request-Id": "sdk-call-1"}
    )
    assert mine.headers["x-request-id"] == "sdk-call-1"
    assert mine.parse()._request_id == "sdk-call-1"  # what the SDK shows its user


def test_models_retrieve_and_list(client, server):
    listed = client.models.list()
    assert [m.id for m in listed.data] == ["primary"]
    primary = client.models.retrieve("primary")
    assert primary.id == "primary" and primary.object == "model"
    assert primary.owned_by == "sr" and primary.created > 0
    assert primary.model_dump() == listed.data[0].model_dump()
    by_artifact = client.models.retrieve(server.artifact)  # an absolute path: slashes
    assert by_artifact.id == "primary"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("someone/else")
    assert caught.value.code == "model_not_found"
    assert caught.value.type == "invalid_request_error"
    assert caught.value.param == "model"


def test_errors_carry_type_param_and_code(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="primary", input="hello", dimensions=10_000)
    error = caught.value
    assert error.status_code == 400
    assert error.type == "invalid_request_error"
    assert error.param == "dimensions"
    assert error.code == "invalid_request"
    assert "embedding size 32" in error.message
    # The worker refused it: the router's request id travelled to the worker's process and
    # came back in its error body, the same id the SDK read from the answer's header.
    assert error.request_id and error.body["request_id"] == error.request_id
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="primary", input=[[7592], [2088, 10**9]])
    assert caught.value.param == "input[1][1]"
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="nope", input="hello")
    assert (caught.value.code, caught.value.param) == ("model_not_found", "model")


async def test_async_client(server):
    async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        answer = await sdk.embeddings.create(model="primary", input="hello world", dimensions=8)
        model = await sdk.models.retrieve("primary")
    assert len(answer.data[0].embedding) == 8
    assert model.id == "primary"
