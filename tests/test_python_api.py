"""The typed Python API (sr.api, Supervisor's helpers, sr/__init__.py's lazy exports).

The helpers are checked against the native routes' own answers on a real in-process router
(the embedded MiniLM, tiny classifier and cross-encoder checkpoints), errors against the
bodies sr.errors puts on the wire, and the types with mypy --strict on the example program
and on a deliberately wrong snippet that must fail.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

import sr
from sr import api
from sr.api import codec
from sr.config.schema import EMBEDDED_DEFAULT_ARTIFACT, Deployment, Replica, SrConfig
from sr.errors import (
    DeadlineExceeded,
    ForwardFailed,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    Overloaded,
    RequestError,
    RequestTooLarge,
    Unavailable,
    WorkerFailed,
)
from sr.models.testing import write_tiny_bert
from sr.pool.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/embed_in_trio_app.py"
# strict-clean on their own
TYPED_MODULES = [
    "sr/__init__.py",
    "sr/api/__init__.py",
    "sr/api/results.py",
    "sr/api/codec.py",
    "sr/api/typed.py",
]
TEXTS = ["A cat sits on the mat.", "Stock prices fell sharply today.", "hello"]
LONG = "word " * 400  # over the default input.max_tokens (256)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **artifacts: str) -> AsyncIterator[Supervisor]:
    config = SrConfig()
    for name, artifact in artifacts.items():
        config.deployments[name] = Deployment(artifact=artifact, replicas=[Replica(device="cpu")])
    run_dir = tmp_path / "run"
    async with sr.open_router(config, in_process=True, threads=1, run_dir=run_dir) as router:
        await router.wait_ready(120)
        yield router


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    """A tiny BERT with one relevance output, as tests/e2e/test_model_families_e2e.py uses."""
    folder = tmp_path_factory.mktemp("cross-encoder")
    return write_tiny_bert(folder, seed=5, with_head=True, labels=["score"])


# -- against a real router --------------------------------------------------------------


async def test_embed_prompt_name_is_the_native_field(tmp_path):
    folder = tmp_path / "prompted"
    write_tiny_bert(folder, seed=0)
    prompts = {"prompts": {"query": "query: "}}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    async with serving(tmp_path, primary=str(folder)) as router:
        native = await router.request(
            "primary", "/v1/embeddings", {"input": TEXTS, "prompt_name": "query"}
        )
        typed = await router.embed("primary", TEXTS, prompt_name="query")
        assert [list(v) for v in typed.vectors] == [row["embedding"] for row in native["data"]]
        assert typed.vectors != (await router.embed("primary", TEXTS)).vectors
        with pytest.raises(InvalidRequest, match="prompt_name: unknown prompt 'passage'"):
            await router.embed("primary", TEXTS, prompt_name="passage")


async def test_embed_gives_the_native_vectors_and_cuts_dimensions(tmp_path):
    async with serving(tmp_path, primary=EMBEDDED_DEFAULT_ARTIFACT) as router:
        native = await router.request("primary", "/v1/embeddings", {"input": TEXTS})
        embeddings = await router.embed("primary", TEXTS)
        assert len(embeddings.vectors) == len(TEXTS)
        for vector, row in zip(embeddings.vectors, native["data"], strict=True):
            assert vector == pytest.approx(row["embedding"], abs=1e-6)
        assert embeddings.model == EMBEDDED_DEFAULT_ARTIFACT
        assert embeddings.deployment == "primary"
        assert embeddings.usage == api.Usage(
            native["usage"]["prompt_tokens"], native["usage"]["total_tokens"]
        )
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            embeddings.model = "x"  # type: ignore[misc]

        # OpenAI's `dimensions` on a normalizing model: the head, back at unit length.
        short = await router.embed(EMBEDDED_DEFAULT_ARTIFACT, TEXTS[0], dimensions=16)
        assert short.deployment == "primary"  # named by its artifact
        head = embeddings.vectors[0][:16]
        norm = math.sqrt(sum(x * x for x in head))
        assert short.vectors[0] == pytest.approx([x / norm for x in head], abs=1e-6)

        cut = await router.embed("primary", ["short", LONG], truncate=True)
        native = await router.request(
            "primary", "/v1/embeddings", {"input": ["short", LONG], "truncate": True}
        )
        assert (
            cut.usage.truncated_inputs
            == ("input[1]",)
            == tuple(native["usage"]["truncated_inputs"])
        )
        assert cut.usage.prompt_tokens == native["usage"]["prompt_tokens"]


async def test_classify_and_decide_give_the_native_answers(tmp_path, tiny_head_model_dir):
    async with serving(
        tmp_path, primary=EMBEDDED_DEFAULT_ARTIFACT, head=str(tiny_head_model_dir)
    ) as router:
        labels = {"animals": "a text about animals", "money": "a text about money"}
        native = await router.request("primary", "/v1/classify", {"input": TEXTS, "labels": labels})
        classified = await router.classify("primary", TEXTS, labels=labels)
        assert_classifications_equal(classified, native)
        assert [r.label for r in classified.results[:2]] == ["animals", "money"]

        own = await router.classify("head", TEXTS)  # the checkpoint's own head and labels
        assert_classifications_equal(
            own, await router.request("head", "/v1/classify", {"input": TEXTS})
        )
        assert list(own.results[0].probabilities) == ["negative", "neutral", "positive"]

        questions = {
            "intent": api.Question(
                criteria={"refund": "wants money back", "praise": "is happy"},
                instructions="What does the customer want?",
            ),
            "topic": api.Question(criteria={"billing": "invoices", "shipping": "parcels"}),
        }
        state = "I was charged twice, please return my money"
        native = await router.request(
            "primary",
            "/v1/decisions",
            {"state": state, "questions": {k: q.to_body() for k, q in questions.items()}},
        )
        decided = await router.decide("primary", state, questions)
        assert list(decided.answers) == ["intent", "topic"]
        for qid, decision in decided.answers.items():
            want = native["answers"][qid]
            assert (decision.type, decision.choice) == (want["type"], want["choice"])
            assert decision.confidence == pytest.approx(want["confidence"], abs=1e-9)
            assert dict(decision.probabilities) == pytest.approx(want["probabilities"], abs=1e-9)
        assert decided.answers["intent"].choice == "refund"
        assert decided.usage.prompt_tokens == native["usage"]["prompt_tokens"]


def assert_classifications_equal(typed: api.Classifications, native: dict) -> None:
    assert typed.usage.prompt_tokens == native["usage"]["prompt_tokens"]
    for result, want in zip(typed.results, native["results"], strict=True):
        assert (result.index, result.label) == (want["index"], want["label"])
        assert list(result.probabilities) == list(want["probabilities"])
        assert dict(result.probabilities) == pytest.approx(want["probabilities"], abs=1e-9)


async def test_rerank_gives_the_native_order_scores_and_documents(tmp_path, cross_encoder):
    query = "where is my invoice"
    documents = ["the invoice was sent by mail", "hello there", "invoices are under billing"]
    async with serving(tmp_path, reranker=str(cross_encoder)) as router:
        body = {"query": query, "documents": documents}
        native = await router.request("reranker", "/v1/rerank", body)
        ranked = await router.rerank("reranker", query, documents)
        assert [r.index for r in ranked.results] == [r["index"] for r in native["results"]]
        assert sorted(r.index for r in ranked.results) == [0, 1, 2]
        for result, want in zip(ranked.results, native["results"], strict=True):
            assert result.score == pytest.approx(want["relevance_score"], abs=1e-9)
            assert result.document == documents[result.index]
        scores = [r.score for r in ranked.results]
        assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
        top = await router.rerank("reranker", query, tuple(documents), top_n=1)
        assert top.results == ranked.results[:1]
        assert top.usage == ranked.usage


async def test_worker_errors_raise_their_own_class_code_and_param(tmp_path, cross_encoder):
    async with serving(
        tmp_path, primary=EMBEDDED_DEFAULT_ARTIFACT, reranker=str(cross_encoder)
    ) as router:
        cases = [
            (router.embed("primary", TEXTS, dimensions=1000), InvalidRequest, "dimensions"),
            (router.embed("primary", []), InvalidRequest, "input"),
            (router.embed("primary", ["ok", LONG], truncate=False), InvalidRequest, "input[1]"),
            (router.embed("primary", "x" * 100_001), RequestTooLarge, "input"),
            (router.classify("primary", TEXTS), InvalidRequest, "labels"),
            (router.rerank("primary", "q", ["d"]), InvalidRequest, None),  # no relevance head
            (router.rerank("reranker", "q", ["d"], top_n=0), InvalidRequest, "top_n"),
            (router.embed("nope", "a"), ModelNotFound, "model"),
        ]
        for call, error_class, param in cases:
            with pytest.raises(error_class) as caught:
                await call
            assert type(caught.value) is error_class
            assert (caught.value.code, caught.value.param) == (error_class.code, param)
        # The untyped route maps by the worker's code too: an unknown path is not_found,
        # not model_not_found (both are 404).
        with pytest.raises(NotFound, match="no route /v1/nope"):
            await router.request("primary", "/v1/nope", {})
        with pytest.raises(InvalidRequest, match="input: must not be an empty list"):
            await router.request("primary", "/v1/embeddings", {"input": []})


# -- bodies, answers and errors without a router ----------------------------------------


def test_bodies_refuse_what_an_untyped_caller_might_pass():
    with pytest.raises(InvalidRequest, match=r"questions\.q: expected sr\.Question, got dict"):
        codec.decisions_body("state", {"q": {"criteria": {"a": "b"}}}, truncate=None)  # type: ignore[dict-item]
    with pytest.raises(InvalidRequest, match="documents: expected a list of strings"):
        codec.rerank_body("q", "one document", top_n=None, truncate=None)
    with pytest.raises(InvalidRequest, match="body: cannot be sent as JSON"):
        codec.encode_body(codec.embeddings_body([b"bytes"], dimensions=None, truncate=None))  # type: ignore[list-item]
    # A str is one text, never its characters.
    assert codec.embeddings_body("abc", dimensions=None, truncate=None) == {"input": "abc"}


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequest("input[2]: must not be empty"),
        InvalidRequest("something else is wrong", param="labels.a"),
        RequestTooLarge("documents: 3000 items; the limit is 2048 per request"),
        ModelNotFound("model: 'x' is not served here"),
        NotFound("no route /v1/x"),
        ForwardFailed("forward failed: RuntimeError: boom"),
        WorkerFailed("replica r1 died"),
        Unavailable("draining"),
        DeadlineExceeded("too slow"),
        Overloaded("queue full", retry_after_s=7),
    ],
)
def test_an_error_body_comes_back_as_the_class_that_wrote_it(error):
    """Round trip through the wire format sr.errors writes (status, headers, body)."""
    back = codec.error_from_answer(error.status, error.headers, error.body())
    assert type(back) is type(error)
    assert back.to_dict() == error.to_dict()
    assert back.headers == error.headers


def test_an_error_sr_does_not_know_keeps_the_workers_status_and_code():
    back = codec.error_from_answer(418, {}, b'{"error": {"code": "teapot", "message": "short"}}')
    assert type(back) is RequestError
    assert (back.status, back.code, back.message, back.type) == (
        418,
        "teapot",
        "short",
        "invalid_request_error",
    )
    plain = codec.error_from_answer(502, {}, b"Bad Gateway")
    assert (type(plain), plain.status, plain.code, plain.message) == (
        RequestError,
        502,
        "http_502",
        "Bad Gateway",
    )


USAGE = '"usage": {"prompt_tokens": 3, "total_tokens": 3}'


@pytest.mark.parametrize(
    ("answer", "count", "detail"),
    [
        (b"not json", 1, "not JSON"),
        (b"[]", 1, "answer: expected an object, got an array"),
        (f'{{"model": "m", "data": [], {USAGE}}}', 1, "data: 0 embeddings for 1 inputs"),
        (
            f'{{"model": "m", "data": [{{"index": 0, "embedding": [1]}},'
            f' {{"index": 0, "embedding": [2]}}], {USAGE}}}',
            2,
            "data: an index appears twice",
        ),
        (
            f'{{"model": "m", "data": [{{"index": 1, "embedding": [1]}}], {USAGE}}}',
            1,
            r"data\[0\]\.index: 1 is outside \[0, 1\)",
        ),
        (
            f'{{"model": "m", "data": [{{"index": 0, "embedding": ["x"]}}], {USAGE}}}',
            1,
            r"data\[0\]\.embedding: expected a number, got a string",
        ),
        ('{"model": "m", "data": [{"index": 0, "embedding": [1]}]}', 1, "usage: expected an"),
    ],
)
def test_a_malformed_answer_is_worker_failed_naming_what_is_wrong(answer, count, detail):
    raw = answer if isinstance(answer, bytes) else answer.encode()
    with pytest.raises(WorkerFailed, match=f"malformed answer from the worker: {detail}"):
        codec.parse_embeddings(raw, "d", count=count)


def test_answers_are_placed_by_index_not_by_position():
    answer = (
        '{"model": "m", "data": [{"index": 1, "embedding": [2, 3]},'
        f' {{"index": 0, "embedding": [0.5, 1]}}], {USAGE}}}'
    )
    parsed = codec.parse_embeddings(answer.encode(), "d", count=2)
    assert parsed.vectors == ((0.5, 1.0), (2.0, 3.0))


# -- the package's typing and its lazy imports ------------------------------------------


def test_import_sr_is_cheap_and_the_lazy_table_matches_what_type_checkers_see():
    code = (
        "import sys, sr\n"
        "heavy = ('torch', 'trio', 'attrs', 'sr.api', 'sr.pool')\n"
        "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
        "sr.Embeddings\n"
        "assert 'sr.api' in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)

    tree = ast.parse((ROOT / "sr" / "__init__.py").read_text())
    checked = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    )
    seen = {
        name: node.module
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        # A star import brings the module's __all__.
        for name in (
            importlib.import_module(node.module).__all__ if alias.name == "*" else [alias.name]
        )
    }
    assert seen == sr._LAZY
    assert sorted(sr.__all__) == sorted([*sr._LAZY, "__version__"])
    for name, module in sr._LAZY.items():
        assert getattr(sr, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'open_routr'"):
        sr.open_routr  # noqa: B018


# Each line marked `# E: code` must be reported with that code, and nothing else anywhere:
# if sr's types regressed to Any these errors would vanish and the test would fail.
WRONG_USE = """\
import functools

import trio

import sr
from sr.config.schema import default_config


async def main() -> None:
    config = default_config()
    async with sr.open_router(config, in_process=True) as router:
        embeddings = await router.embed("primary", ["a"])
        first: str = embeddings.vectors[0]  # E: assignment
        await router.rerank("primary", "q", ["d"], top_k=2)  # E: call-arg
        await router.classify("primary", ["a"], labels=["x"])  # E: arg-type
        decided = await router.decide("primary", "s", {"q": sr.Question(criteria={"a": "b"})})
        choice: int = decided.answers["q"].choice  # E: assignment
        sr.open_routr  # E: attr-defined
    async with trio.open_nursery() as nursery:
        server: sr.ServingRouter = await nursery.start(functools.partial(sr.serve, config))
        await server.core.embed("primary", 3)  # E: arg-type
"""


def doc_programs() -> list[str]:
    """The complete programs of docs/python-api.md (the blocks that end in trio.run)."""
    text = (ROOT / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    programs = [block for block in blocks if "trio.run(main)" in block]
    assert len(programs) == 2  # sr.open_router and sr.serve
    return programs


SEAMS = """\
from sr.pool.supervisor import Supervisor
from sr.router.app import SupervisorLike


def front_end_core(core: Supervisor) -> SupervisorLike:
    return core
"""


def test_the_example_passes_mypy_strict_and_a_wrong_use_fails(tmp_path):
    wrong = tmp_path / "wrong_use.py"
    wrong.write_text(WRONG_USE)
    docs = [tmp_path / f"doc_program_{i}.py" for i in range(2)]
    for path, program in zip(docs, doc_programs(), strict=True):
        path.write_text(program)
    # The seam between pool and front end: the Supervisor is what the front end may be given.
    seams = tmp_path / "seams.py"
    seams.write_text(SEAMS)
    expected = {
        (number, line.split("# E: ")[1])
        for number, line in enumerate(WRONG_USE.splitlines(), start=1)
        if "# E: " in line
    }
    # follow-imports=silent: sr's other modules are read for their types but their own
    # findings are not reported, as for any installed package (docs/python-api.md).
    command = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent"]
    command += ["--no-error-summary", EXAMPLE, *TYPED_MODULES, *map(str, docs), str(seams)]
    command += [str(wrong)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    found = set()
    for line in errors:
        match = re.fullmatch(r"(.+?):(\d+): error: .*\[([a-z-]+)\]", line)
        assert match is not None and Path(match.group(1)).name == wrong.name, line
        found.add((int(match.group(2)), match.group(3)))
    assert found == expected, result.stdout + result.stderr


def test_the_example_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--in-process"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert "3 embeddings of dimension 384" in result.stdout
    assert "dimensions=64: 64 values" in result.stdout
    assert "intent: refund" in result.stdout
    assert "rerank refused (400 invalid_request)" in result.stdout


@pytest.mark.e2e
def test_the_documented_programs_run(tmp_path):
    """docs/python-api.md's two programs, as written (real worker processes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    open_router_program, serve_program = doc_programs()
    for program, wanted in ((open_router_program, "\n64\n"), (serve_program, "serving on http")):
        result = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert wanted in result.stdout


def test_the_routers_serving_path_imports_neither_torch_nor_httpx():
    """These imports are the router's own start: torch belongs in workers and httpx only in
    a router with attached workers (sr.pool.transport); either would delay every router's
    listening, and httpx did (0.14 s on a 2-core host)."""
    code = (
        "import sys\n"
        "import sr.cli, sr.router.serve, sr.pool.supervisor, sr.pool.worker_access\n"
        "loaded = [m for m in ('torch', 'httpx', 'onnxruntime', 'numpy') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
