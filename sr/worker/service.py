"""WorkerService: one model on one device, served through `handle` (HTTP-agnostic).

States: starting -> loading -> warming -> ready, or -> failed with a reason (artifact not
found, device not available, golden check failed, load error). `handle` answers at once in
every state, so `/health` tells the pool what is going on while the model loads. The HTTP
server (sr.worker.http over sr.http.server) and in-process replicas (sr.pool) both call
`handle`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
import trio

from sr.answer import JSON_CONTENT_TYPE, Answer
from sr.config.precision import Precision, cpu_flags, resolve_precision
from sr.config.schema import DEFAULT_KERNEL
from sr.errors import (
    ArtifactNotFound,
    ForwardFailed,
    MethodNotAllowed,
    NotFound,
    RequestError,
    Unavailable,
    UsageError,
)
from sr.events import EventSink
from sr.http.hop import NO_HOP, Hop
from sr.http.jsonbody import compact_json
from sr.models import probe_cache
from sr.models.golden import golden_check
from sr.request_id import current as current_request_id
from sr.settings import host_cache_dir
from sr.worker import validation
from sr.worker.device_thread import DeviceThread
from sr.worker.embedding_answer import VectorList
from sr.worker.engine import INLINE_FORWARD_TOKENS, Engine
from sr.worker.faults import FaultState
from sr.worker.kept_checks import start_checks
from sr.worker.metrics import WorkerMetrics
from sr.worker.options import WorkerOptions
from sr.worker.placement import placement_for
from sr.worker.served_as import current_deployment
from sr.worker.state import SETTLED, WorkerState, check_transition
from sr.worker.tasks import Tasks
from sr.worker.threads import ForwardRunner
from sr.worker.timing import RequestTiming
from sr.worker.timing import current as current_timing
from sr.worker.warmup import (
    ProbeResult,
    core_yield_for,
    resolve_limits,
)

if TYPE_CHECKING:
    from sr.worker.tracing import WorkerTracing

JSON_HEADERS = [JSON_CONTENT_TYPE]
TEXT_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
_log = logging.getLogger("sr.worker")
# An answer estimated above this many floats (about 50 ms of JSON) is written off the event
# loop; one text's answer (a few thousand) is written inline, without a thread's hand-off.
_INLINE_ANSWER_FLOATS = 100_000


def _encode(answer: Any) -> bytes:
    if type(answer) is VectorList:  # its float32 vectors written by sr, faster than json's
        return answer.to_json()
    return compact_json(answer).encode()


# Read on every forward: a module global, not the enum's attribute (about 0.1 us less).
_READY = WorkerState.READY
# After an `exit` fault the HTTP adapter exits as soon as the answer is sent; this is the
# fallback for callers of `handle` that are not the HTTP adapter.
_EXIT_FALLBACK_S = 0.5


def load_from_artifact(options: WorkerOptions):
    from sr.models import load_model, resolve_artifact
    from sr.worker import preloaded

    model = preloaded.claim(options)  # loaded by the fork server that forked us
    if model is not None:
        return model

    path = resolve_artifact(options.artifact, options.revision)
    kernel = None if options.kernel == DEFAULT_KERNEL else options.kernel
    return load_model(
        path, device=options.device, dtype=options.dtype, kernel=kernel, engine=options.engine
    )


class WorkerService:
    def __init__(
        self,
        options: WorkerOptions,
        *,
        events: EventSink | None = None,
        load_model_fn: Callable[[WorkerOptions], Any] = load_from_artifact,
        golden_check_fn: Callable[..., Any] = golden_check,
        exit_process: Callable[[int], Any] = os._exit,
        adaptive_mode: int = 0,
        host_cpu_flags: frozenset[str] | None = None,
    ) -> None:
        options.validate()
        self.options = options
        # The dtype served: `--dtype`, or the profile's choice on this host when `auto`
        # (sr.config.precision); the model is loaded in it and the card says why.
        self.precision: Precision = resolve_precision(
            options.profile,
            options.dtype,
            options.device,
            cpu_flags=cpu_flags() if host_cpu_flags is None else host_cpu_flags,
            gpu_bf16=_gpu_bf16(options.device),
            engine=options.engine,
        )
        self.events = events or EventSink()
        self.metrics = WorkerMetrics()
        # Adaptive thread learning (VLLM_SRUN_CPU_ADAPTIVE_THREADS) applies to CPU workers.
        self.runner = ForwardRunner(
            options.threads,
            mode=adaptive_mode if options.device == "cpu" else 0,
            events=self.events,
        )
        self.faults = FaultState()
        self.tracing: WorkerTracing | None = None  # opened by `run` when traces are on
        self.exit_process = exit_process
        self.exit_requested = False
        self.state = WorkerState.STARTING
        self.reason: str | None = None
        self.model = None
        self._floats_per_token = 0
        self.engine: Engine | None = None
        self.tasks: Tasks | None = None
        self.golden: dict[str, Any] = {
            "status": "pending",
            "reason": None,
            "max_abs_diff": None,
            "min_cosine": None,
            "against": None,
        }
        self.probe: ProbeResult | None = None
        self.cpu_yield: dict[str, Any] = {"enabled": False, "reason": "not checked yet"}
        self.cpu_placement: dict[str, Any] = {"enabled": False, "reason": "not checked yet"}
        self._load_model_fn = load_model_fn
        self._golden_check_fn = golden_check_fn
        self._settled = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._health = self._health_response()
        forward = self._forward_route
        self._routes: dict[str, tuple[str, Callable[[bytes], Awaitable[Answer]]]] = {
            "/v1/embeddings": ("POST", lambda body: forward(body, "embeddings")),
            "/v1/sparse_embeddings": ("POST", lambda body: forward(body, "sparse_embeddings")),
            "/v1/classify": ("POST", lambda body: forward(body, "classify")),
            "/v1/decisions": ("POST", lambda body: forward(body, "decisions")),
            "/v1/rerank": ("POST", lambda body: forward(body, "rerank")),
            "/v1/tokenize": ("POST", lambda body: forward(body, "tokenize")),
            "/v1/token_embeddings": ("POST", lambda body: forward(body, "token_embeddings")),
            "/v1/detokenize": ("POST", lambda body: forward(body, "detokenize")),
            "/v1/models": ("GET", self._models_route),
            "/health": ("GET", self._health_route),
            "/health/live": ("GET", self._live_route),
            "/metrics": ("GET", self._metrics_route),
        }

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load on the device thread, then serve forwards until cancelled."""
        device = DeviceThread()
        if self.options.traces is not None:  # in the serving process: the SDK's thread
            from sr.worker.tracing import WorkerTracing

            self.tracing = WorkerTracing.open(self.options.traces, self._trace_attributes())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                if await self._start(device):
                    nursery.start_soon(self.engine.run)
        finally:
            self._nursery = None
            device.stop()
            if self.tracing is not None:
                tracing, self.tracing = self.tracing, None
                with trio.CancelScope(shield=True):  # bounded (sr.traces)
                    await trio.to_thread.run_sync(tracing.shutdown)

    def _trace_attributes(self) -> dict[str, str]:
        """The worker's resource attributes on its spans."""
        return {
            "sr.artifact": self.options.artifact,
            "sr.device": self.options.device,
            "process.pid": str(os.getpid()),
        }

    async def wait_settled(self) -> WorkerState:
        """Wait until the worker is ready or failed; returns the state."""
        await self._settled.wait()
        return self.state

    def _set_state(self, state: WorkerState, reason: str | None = None) -> None:
        check_transition(self.state, state)  # sr.worker.state: the table of moves
        self.state, self.reason = state, reason
        self._health = self._health_response()
        self.events.emit(
            "worker_state", state=state.value, reason=reason, artifact=self.options.artifact
        )
        if state in SETTLED:
            self._settled.set()

    def _health_response(self) -> Answer:
        if self.state is _READY:
            return 200, JSON_HEADERS, compact_json({"status": _READY.value}).encode()
        status = {"status": self.state.value, "reason": self.reason}
        return 503, JSON_HEADERS, compact_json(status).encode()

    def _kept_checks_file(self) -> Path | None:
        """Where the start checks are kept (sr.worker.kept_checks): for a CPU worker at a
        fixed thread count, on sr's own loader and golden check; None otherwise."""
        if (
            self.options.device != "cpu"
            or self.runner.mode
            or self._load_model_fn is not load_from_artifact
            or self._golden_check_fn is not golden_check
        ):
            return None
        return probe_cache.start_checks_file(host_cache_dir())

    async def _start(self, device: DeviceThread) -> bool:
        options = self.options
        self._set_state(WorkerState.LOADING)
        try:
            _check_device(options.device)
            served = attrs.evolve(options, dtype=self.precision.dtype)
            model = await device.run(lambda: self._load_model_fn(served))
        except ArtifactNotFound as error:
            self._set_state(WorkerState.FAILED, f"artifact not found: {error}")
            return False
        except DeviceUnavailable as error:
            self._set_state(WorkerState.FAILED, f"device not available: {error}")
            return False
        except Exception as error:
            self._set_state(WorkerState.FAILED, f"load failed: {type(error).__name__}: {error}")
            return False
        self.model = model
        # The most floats an answer carries per token of its rows (a per-token vector, or a
        # sparse vector over the vocabulary per text): what sizes its JSON.
        self._floats_per_token = max(
            getattr(getattr(model, "backbone", None), "hidden_size", 0),
            getattr(model, "embedding_dim", None) or 0,
        )
        try:
            limits = resolve_limits(options, model)
        except UsageError as error:  # an input cap the model cannot take
            self._set_state(WorkerState.FAILED, f"load failed: {error}")
            return False
        self._set_state(WorkerState.WARMING)
        try:
            self.cpu_placement = await device.run(self._place_peers)
            golden, probe = await device.run(
                lambda: start_checks(
                    model,
                    self.runner,
                    limits.max_input_tokens,
                    self._kept_checks_file(),
                    self._golden_check_fn,
                )
            )
            self.golden = {
                "status": golden.status,
                "reason": golden.reason,
                "max_abs_diff": golden.max_abs_diff,
                # the deviation from float32 measured on the golden set (sr.models.golden)
                "min_cosine": getattr(golden, "min_cosine", None),
                "against": getattr(golden, "against", None),
            }
            if golden.status != "passed":
                self._set_state(WorkerState.FAILED, f"golden check failed: {golden.reason}")
                return False
            self.probe = probe
            calibrate = getattr(model, "calibrate_threads", None)
            if calibrate is not None:
                await device.run(lambda: self.runner.at_each_count(calibrate))
            self.cpu_yield = await device.run(
                lambda: self._allow_yielding(model, limits.max_input_tokens)
            )
        except Exception as error:
            self._set_state(WorkerState.FAILED, f"warm-up failed: {type(error).__name__}: {error}")
            return False
        self.runner.unlock()
        cross_request = self.probe.passed or options.profile == "throughput"
        # Once per start: the precision served and whether rows stay bit-identical alone
        # and batched at it (if not, `exact` serves one request per forward).
        self.events.emit(
            "worker_batching",
            dtype=self.precision.dtype,
            dtype_reason=self.precision.reason,
            profile=options.profile,
            exact_batching=self.probe.passed,
            cross_request=cross_request,
            detail=self.probe.detail,
        )
        self.engine = Engine(
            model,
            device,
            self.runner,
            limits,
            cross_request=cross_request,
            on_forward=self.metrics.observe_forward,
            inline_tokens=INLINE_FORWARD_TOKENS if self._forwards_inline() else 0,
        )
        self.metrics.watch_queue(lambda: self.engine.queued_rows)
        self.tasks = Tasks(
            model,
            self.engine,
            artifact=options.artifact,
            max_input_tokens=limits.max_input_tokens,
            overflow=options.overflow,
        )
        self._set_state(_READY)
        return True

    def _forwards_inline(self) -> bool:
        """May short forwards run on the Trio thread? On a CPU at 1 thread a forward runs
        inline on whatever thread calls it, so the device thread's hand-off there and back
        (about 0.2 ms of a 5 ms forward) buys nothing but the event loop's freedom meanwhile
        (engine rules)."""
        return self.options.device == "cpu" and self.runner.single_threaded

    def _allow_yielding(self, model, max_input_tokens: int) -> dict[str, Any]:
        """Let the runner yield cores to other work (sr.worker.contention) where it may, at
        the counts whose bits the probe found equal to the configured count's; the card's
        `cpu_yield` entry either way."""
        options = self.options
        why_not = None
        if options.device != "cpu":
            why_not = "a GPU worker"
        elif options.threads < 2:
            why_not = "1 thread configured"
        elif self.runner.mode:
            why_not = f"adaptive thread mode {self.runner.mode} chooses the counts"
        elif not hasattr(model, "embed"):
            why_not = "the model has no probe forward"
        if why_not is not None:
            return {"enabled": False, "reason": why_not}
        core_yield, detail = core_yield_for(model, options.threads, max_input_tokens)
        if core_yield is None:
            return {"enabled": False, "reason": detail}
        self.runner.allow_yielding(core_yield)
        return {"enabled": True, "reason": detail}

    def _place_peers(self) -> dict[str, Any]:
        """Keep the OpenMP peers of multi-thread forwards off the device thread's CPU
        (sr.worker.placement); runs on the device thread, whose team it finds. The card's
        `cpu_placement` entry either way."""
        if self.options.device != "cpu":
            return {"enabled": False, "reason": "a GPU worker"}
        placement, detail = placement_for(max(self.runner.thread_counts))
        if placement is None:
            return {"enabled": False, "reason": detail}
        self.runner.place_peers(placement)
        return {"enabled": True, "reason": detail}

    def cpu_placement_card(self) -> dict[str, Any]:
        placement = self.runner.placement
        return {**self.cpu_placement, **(placement.card() if placement is not None else {})}

    def cpu_yield_card(self) -> dict[str, Any]:
        core_yield = self.runner.yielding
        return {**self.cpu_yield, **(core_yield.card() if core_yield is not None else {})}

    # -- requests --------------------------------------------------------------------------

    async def handle(self, method: str, path: str, body: bytes, hop: Hop = NO_HOP) -> Answer:
        """Answer one request. The hop's `request_id` (the router's, sr.request_id) is
        current while it is answered, so its error body and log lines carry it; so is its
        `deployment`, the name the router serves this worker under (sr.worker.served_as).
        Its `traceparent`: the router's hop span, when its traces are on
        (sr.worker.tracing)."""
        request_id, deployment, traceparent = hop
        if request_id is None and deployment is None:
            return await self._handle(method, path, body, traceparent)
        id_token = current_request_id.set(request_id)
        name_token = current_deployment.set(deployment)
        try:
            return await self._handle(method, path, body, traceparent)
        finally:
            current_deployment.reset(name_token)
            current_request_id.reset(id_token)

    async def _handle(
        self, method: str, path: str, body: bytes, traceparent: str | None = None
    ) -> Answer:
        route = self._routes.get(path)
        if route is None:
            if path == "/admin/faults" and self.options.fault_injection:
                response = await self._faults_route(method, body)
            else:
                response = NotFound(f"no route {path}").answer()
            self.metrics.count_answer("other", response[0])
            return response
        allowed, answer = route
        if method != allowed:
            refused = MethodNotAllowed(f"{path} takes {allowed}", headers={"Allow": allowed})
            response = refused.answer()
        elif allowed == "POST":  # the task routes: timed (sr.worker.timing)
            with RequestTiming() as timing:
                if traceparent is not None and self.tracing is not None:
                    timing.forwards = []  # the engine notes each forward (sr.worker.tracing)
                response = await self._answer(path, answer, body)
            if timing.reached_engine is not None and response[0] == 200:  # `computed`
                status, headers, payload = response
                response = status, [*headers, timing.header()], payload
            if timing.forwards is not None:
                self._record_trace(traceparent, path, timing, response[0])
        else:
            response = await self._answer(path, answer, body)
        self.metrics.count_answer(path, response[0])
        return response

    def _record_trace(
        self, traceparent: str | None, path: str, timing: RequestTiming, status: int
    ) -> None:
        if self.tracing is None or traceparent is None:
            return
        try:
            self.tracing.record(
                traceparent, path, timing, status,
                request_id=current_request_id.get(), deployment=current_deployment.get(),
            )  # fmt: skip
        except Exception:  # a span lost must never cost the answer
            _log.exception("trace_record_failed path=%s", path)

    async def _answer(
        self, path: str, answer: Callable[[bytes], Awaitable[Answer]], body: bytes
    ) -> Answer:
        try:
            return await answer(body)
        except RequestError as error:
            return error.answer()
        except Exception as error:  # a bug must not take the worker down
            _log.exception("unexpected error on %s", path)
            return RequestError(f"{type(error).__name__}: {error}").answer()

    async def _forward_route(self, body: bytes, task: str) -> Answer:
        if self.state is not _READY:
            raise Unavailable(
                f"worker is {self.state.value}" + (f": {self.reason}" if self.reason else "")
            )
        if self.options.fault_injection and not await self.faults.before_forward():
            raise ForwardFailed("injected fault: fail")
        request = validation.parse_object(body)
        answer = await getattr(self.tasks, task)(request)
        timing = current_timing()
        if timing is not None and timing.tokens * self._floats_per_token > _INLINE_ANSWER_FLOATS:
            # Thousands of per-token vectors take seconds to write as JSON (about 0.5 us a
            # float): written on a helper thread, so /health and the other requests are
            # answered meanwhile and the replica is not taken for dead.
            return 200, JSON_HEADERS, await trio.to_thread.run_sync(_encode, answer)
        return 200, JSON_HEADERS, _encode(answer)

    async def _health_route(self, body: bytes) -> Answer:
        return self._health

    async def _live_route(self, body: bytes) -> Answer:
        return 200, JSON_HEADERS, b'{"status":"live"}'

    async def _metrics_route(self, body: bytes) -> Answer:
        return 200, TEXT_HEADERS, self.metrics.render()

    async def _models_route(self, body: bytes) -> Answer:
        return 200, JSON_HEADERS, compact_json({"object": "list", "data": [self.card()]}).encode()

    async def _faults_route(self, method: str, body: bytes) -> Answer:
        if method == "GET":
            return 200, JSON_HEADERS, compact_json(self.faults.card()).encode()
        if method != "POST":
            refused = MethodNotAllowed(
                "/admin/faults takes GET or POST", headers={"Allow": "GET, POST"}
            )
            return refused.answer()
        try:
            card = self.faults.configure(body)
        except RequestError as error:
            return error.answer()
        self.events.emit("worker_fault_injected", **card)
        if card["mode"] == "exit":
            self.exit_requested = True
            if self._nursery is not None:
                self._nursery.start_soon(self._exit_later)
        return 200, JSON_HEADERS, compact_json(card).encode()

    async def _exit_later(self) -> None:
        await trio.sleep(_EXIT_FALLBACK_S)
        self.exit_process(1)

    def card(self) -> dict[str, Any]:
        options, model, engine = self.options, self.model, self.engine
        return {
            "id": options.artifact,
            "object": "model",
            "artifact": options.artifact,
            "revision": options.revision,
            "weights_sha256": getattr(model, "weights_sha256", None),
            # a LoRA adapter's own weights and its base's (sr.models.adapter), or None
            "adapter": getattr(model, "adapter_card", None),
            "device": options.device,
            "threads": options.threads,
            "profile": options.profile,
            "dtype": self.precision.dtype,
            "precision": self.precision.card(),  # the dtype served, as asked, and why
            # the kernel of the linear products (oneDNN packed or BLAS) and why
            "kernel": getattr(model, "kernel_card", None),
            # what computes the backbone: torch, or ONNX Runtime's exported graph
            "engine": getattr(model, "engine_card", None),
            "state": self.state.value,
            "reason": self.reason,
            "limits": engine.limits.card() if engine else None,
            "overflow": options.overflow,
            "embedding_dim": getattr(model, "embedding_dim", None),
            "pooling": list(getattr(model, "pooling_modes", None) or []) or None,
            "head_labels": getattr(model, "head_labels", None),
            # what the head labels: "sequence" (a text), "token" (each token) or None
            "head_task": getattr(model, "head_task", None),
            "head_activation": getattr(model, "head_activation", None),
            # config_sentence_transformers.json's prompts: {texts: {name: text},
            # default_prompt_name} (sr.models.prompts)
            "prompts": _card_of(getattr(model, "prompts", None)),
            # a sparse encoder's SpladePooling: {pooling, activation, max_active_dims}
            "sparse": _card_of(getattr(getattr(model, "sparse_head", None), "spec", None)),
            "golden": self.golden,
            "batching": {
                "cross_request": engine.cross_request if engine else None,
                # rows bit-identical alone and batched at the dtype served (the probe)
                "exact_batching": self.probe.passed if self.probe else None,
                "probe": self.probe.card() if self.probe else None,
                "cache_rows": engine.cache.capacity if engine and engine.cache is not None else 0,
            },
            "adaptive_threads": self.runner.report(),
            # fewer threads while other work holds the cores (sr.worker.contention)
            "cpu_yield": self.cpu_yield_card(),
            # the OpenMP peers kept off the device thread's CPU (sr.worker.placement)
            "cpu_placement": self.cpu_placement_card(),
        }


def _card_of(part) -> dict[str, Any] | None:
    return part.card() if part is not None else None


class DeviceUnavailable(Exception):
    """The requested accelerator is not present on this host."""


def _gpu_bf16(device: str) -> bool:
    """Whether the GPU `device` computes bfloat16 natively (False on cpu or when absent)."""
    if device == "cpu" or not torch.cuda.is_available():
        return False
    index = int(device.partition(":")[2])
    if index >= torch.cuda.device_count():
        return False  # the start fails with "device not available" anyway
    with torch.cuda.device(index):
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.4 has no `including_emulation`
            return torch.cuda.is_bf16_supported()


def _check_device(device: str) -> None:
    if device == "cpu":
        return
    index = int(device.partition(":")[2])
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"{device}: torch sees no GPU on this host")
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"{device}: only {torch.cuda.device_count()} GPU(s) visible")
