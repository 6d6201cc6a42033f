"""The batching engine: Trio queues rows, the device thread runs batched forwards.

Rules, in one place:
- Every forward runs through `ForwardRunner.run` (thread count) on the one DeviceThread,
  except a short one on a CPU at 1 thread (`inline_tokens`): at most INLINE_FORWARD_TOKENS
  padded tokens, the previous forward under INLINE_FORWARD_S and nothing on the device
  thread, it runs on the caller's Trio thread, where an operator at 1 thread runs as it
  would on the device thread (no OpenMP team, the same bits). The hand-off there and back
  is two thread wake-ups (measured: 0.48 ms of 7.9 ms for one short text to a MiniLM
  worker); the event loop waits for those few milliseconds instead, and one forward at a
  time still holds the model. Not when other requests reach the engine in the scheduling
  round the forward first gives them: requests arriving together then queue while the
  first one's forward runs on the device thread and share the next forward, as without
  this rule.
- A submission is the rows of one request (all questions of a decision request are one
  submission). Identical rows inside it are computed once.
- With cross-request batching on, each round takes every queued submission (a window),
  sorts its rows by length and cuts them into batches within the limits; rows of several
  requests then share forwards. With it off (profile `exact` and a failed invariance probe)
  a round takes one submission, so a forward only ever holds one request's rows.
  A window is finished before the next is taken, so no row waits behind newer ones forever.
- The result cache (LRU over exact token ids) is only enabled when batching is invariant:
  then an answer does not depend on its batch, so a cached answer is the computed answer.
- A submission whose caller went away is dropped from batches not yet started.
- An idle engine (no window being served, no forward of an earlier caller in flight,
  nothing queued) runs a submission's forwards from the caller's own task: they are the
  forwards a window of that one submission would run, without the hand-off to the
  serving task and back. Submissions arriving meanwhile queue for the serving task.
- A row of an `embed` kind whose `second` is inside it (a prompt's tokens, under the
  Pooling's `include_prompt: false`) is pooled from there; any other row pools every token.
- A submission notes when its first forward started and how long its forwards took; the
  caller's request timing (sr.worker.timing) gets them when `compute` returns. A traced
  request's timing also gets each forward (its rows, padded tokens, requests sharing it).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import torch
import trio

from sr.errors import ForwardFailed
from sr.lru import LruCache
from sr.models.splade import sparse_entries
from sr.worker import timing
from sr.worker.batching import Limits, padded_tokens, plan_batches
from sr.worker.device_thread import DeviceThread

# `embed_unnormalized`: the vector before the checkpoint's Normalize module (TEI's
# `normalize: false`); a kind of its own so that cached rows never mix the two. `token`:
# a token-classification head's logits, one list per token of the row. `hidden`: the last
# hidden state per token, before pooling (TEI's /embed_all). `sparse`: a sparse encoder's
# SPLADE vector, answered as (indices, values) of its non-zero entries.
KINDS = ("embed", "embed_unnormalized", "classify", "rerank", "token", "hidden", "sparse")
# Kinds whose forward answers per token ([T, ...] over the packed rows), split per row.
_PER_TOKEN = frozenset({"token", "hidden"})
_SPARSE = frozenset({"sparse"})
_CPU = torch.device("cpu")
DEFAULT_CACHE_ROWS = 4096
# A forward run on the Trio thread holds its event loop: only short ones after a short one.
INLINE_FORWARD_TOKENS = 64
INLINE_FORWARD_S = 0.02


class _Row:
    __slots__ = ("ids", "length", "second", "slot", "submission")

    def __init__(self, ids: list[int], second: int, submission: _Submission, slot: int) -> None:
        self.ids = ids
        self.second = second  # where a pair's second text starts; len(ids) for one text
        self.length = len(ids)
        self.submission = submission
        self.slot = slot


class _Submission:
    __slots__ = (
        "abandoned", "done", "error", "first_forward", "forward_s", "forwards", "kind",
        "remaining", "results", "rows",
    )  # fmt: skip

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.rows: list[_Row] = []
        self.results: list[list[float] | None] = []
        self.remaining = 0
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.abandoned = False
        # For the request's timing (sr.worker.timing): when the first forward holding one
        # of its rows started, and the seconds its forwards took (perf_counter clock).
        self.first_forward: float | None = None
        self.forward_s = 0.0
        # A traced request's list of its forwards (sr.worker.timing), else None.
        self.forwards: list[tuple[float, float, int, int, int]] | None = None


class Engine:
    def __init__(
        self,
        model,
        device: DeviceThread,
        runner,
        limits: Limits,
        *,
        cross_request: bool,
        cache_rows: int = DEFAULT_CACHE_ROWS,
        on_forward: Callable[[int, int, int, float], None] | None = None,
        inline_tokens: int = 0,
    ) -> None:
        self.model = model
        self.limits = limits
        self.cross_request = cross_request
        self.cache: LruCache[tuple, list[float]] | None = (
            LruCache(cache_rows) if cross_request and cache_rows > 0 else None
        )
        self.forwards = 0
        self._device = device
        self._runner = runner
        # Forwards of at most this many padded tokens may run on the caller's thread
        # (engine rules); 0: never.
        self._inline_tokens = inline_tokens
        self._last_forward_s = float("inf")  # none yet: the first goes to the device thread
        self._forward_fns = {
            "embed": lambda rows: _embed(model, rows),
            "embed_unnormalized": lambda rows: _embed(model, rows, normalize=False),
            "sparse": lambda rows: model.embed([r.ids for r in rows]),
            "classify": lambda rows: model.classify_logits([r.ids for r in rows]),
            "rerank": lambda rows: model.rerank_logits(
                [r.ids for r in rows], [r.second for r in rows]
            ),
            "token": lambda rows: model.token_logits([r.ids for r in rows]),
            "hidden": lambda rows: model.token_states([r.ids for r in rows]),
        }
        self._pending: collections.deque[_Submission] = collections.deque()
        self._wakeup = trio.Event()
        # A window being served or a caller's own forwards in flight (engine rules).
        self._busy = False
        self._on_forward = on_forward  # (rows, padded tokens, requests, seconds) per forward

    @property
    def queued_rows(self) -> int:
        return sum(s.remaining for s in self._pending)

    async def compute(
        self, kind: str, rows: list[list[int]], second_starts: list[int] | None = None
    ) -> list[list]:
        """Answer each row (one list of floats per row, in order; for `token`, one such
        list per token of the row), sharing forwards. Pairs (kind `rerank`) give where
        each row's second text starts."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        answers: list[list[float] | None] = [None] * len(rows)
        submission = _Submission(kind)
        slot_of: dict[tuple, int] = {}
        wanted: list[tuple[int, int]] = []  # (answer index, submission slot)
        for index, ids in enumerate(rows):
            second = len(ids) if second_starts is None else second_starts[index]
            key = (tuple(ids), second)
            if self.cache is not None:
                cached = self.cache.get((kind, key))
                if cached is not None:
                    answers[index] = cached
                    continue
            slot = slot_of.get(key)
            if slot is None:
                slot = slot_of[key] = len(submission.rows)
                submission.rows.append(_Row(ids, second, submission, slot))
            wanted.append((index, slot))
        request_timing = timing.current()
        submitted = time.perf_counter() if request_timing is not None else 0.0
        if submission.rows:
            if request_timing is not None:
                submission.forwards = request_timing.forwards
            submission.results = [None] * len(submission.rows)
            submission.remaining = len(submission.rows)
            try:
                if self._busy or self._pending:
                    self._pending.append(submission)
                    self._wakeup.set()
                    await submission.done.wait()
                else:
                    await self._serve_alone(submission)
            except BaseException:
                submission.abandoned = True
                raise
            if submission.error is not None:
                raise submission.error
            for index, slot in wanted:
                answers[index] = submission.results[slot]
        if request_timing is not None:
            request_timing.add_submission(
                submitted, submission.first_forward, submission.forward_s, sum(map(len, rows))
            )
        return answers  # type: ignore[return-value]

    async def _serve_alone(self, submission: _Submission) -> None:
        """An idle engine's submission, its forwards run from the caller's task: the
        batches a window of this one submission gets (engine rules)."""
        self._busy = True
        try:
            await self._serve(submission.kind, submission.rows)
        finally:
            self._busy = False
            if self._pending:  # arrived meanwhile: the serving task takes them
                self._wakeup.set()

    async def run(self) -> None:
        """Serve the queue until cancelled."""
        while True:
            if not self._pending or self._busy:
                # Nothing queued, or a caller's own forwards in flight: wait to be woken
                # (a queued submission, or those forwards' end).
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            self._busy = True
            try:
                window = self._take_window()
                by_kind: dict[str, list[_Row]] = {}
                for submission in window:
                    by_kind.setdefault(submission.kind, []).extend(submission.rows)
                for kind, rows in by_kind.items():
                    await self._serve(kind, rows)
            finally:
                self._busy = False

    async def _serve(self, kind: str, rows: list[_Row]) -> None:
        """Rows of one kind cut into batches within the limits, each forwarded."""
        batches = plan_batches(
            rows,
            lambda r: r.length,
            max_num_seqs=self.limits.max_num_seqs,
            max_num_batched_tokens=self.limits.max_num_batched_tokens,
        )
        for batch in batches:
            live = [r for r in batch if not r.submission.abandoned]
            if live:
                await self._forward(kind, live)

    def _take_window(self) -> list[_Submission]:
        if self.cross_request:
            window = list(self._pending)
            self._pending.clear()
        else:
            window = [self._pending.popleft()]
        return [s for s in window if not s.abandoned]

    async def _forward(self, kind: str, batch: list[_Row]) -> None:
        forward = self._forward_fns[kind]
        padded = padded_tokens([r.length for r in batch])

        def work() -> tuple[list[list[float]], float, float]:
            started = time.perf_counter()
            with torch.inference_mode():
                out = self._runner.run(lambda: forward(batch), padded)
                # float32 on the CPU in one operator (none where it already is, as the
                # torch models answer); nothing to detach from under inference mode.
                out = out.to(_CPU, torch.float32)
                values = sparse_entries(out) if kind in _SPARSE else out.tolist()
            if kind in _PER_TOKEN:
                values = _per_row(values, batch)
            return values, started, time.perf_counter() - started

        inline = await self._may_run_inline(padded)
        try:
            if inline:
                outputs, started, seconds = work()
            else:
                outputs, started, seconds = await self._device.run(work)
        except Exception as error:  # a broken forward fails its requests, not the worker
            failure = ForwardFailed(f"forward failed: {type(error).__name__}: {error}")
            for submission in {r.submission for r in batch}:
                submission.error = failure
                submission.abandoned = True  # its other rows need not run
                submission.done.set()
            return
        finally:
            self.forwards += 1
        self._last_forward_s = seconds
        submissions = {r.submission for r in batch}
        for submission in submissions:
            if submission.first_forward is None:
                submission.first_forward = started
            submission.forward_s += seconds
            if submission.forwards is not None:
                submission.forwards.append((started, seconds, len(batch), padded, len(submissions)))
        if self._on_forward is not None:
            self._on_forward(len(batch), padded, len(submissions), seconds)
        for row, values in zip(batch, outputs, strict=True):
            submission = row.submission
            submission.results[row.slot] = values
            if self.cache is not None:
                self.cache.put((submission.kind, (tuple(row.ids), row.second)), values)
            submission.remaining -= 1
            if submission.remaining == 0:
                submission.done.set()

    async def _may_run_inline(self, padded: int) -> bool:
        """May this forward run on the caller's thread (engine rules)?"""
        if padded > self._inline_tokens or self._last_forward_s > INLINE_FORWARD_S:
            return False
        # Requests that arrived with this one get one scheduling round to reach the
        # engine first: queued, they share the next forward, which they could not do
        # behind an event loop held by this one.
        await trio.lowlevel.checkpoint()
        return not self._pending and not self._device.in_flight


def _embed(model, rows: list[_Row], **options) -> torch.Tensor:
    """The `embed` kinds' forward: each row pooled from its `second` when that lies inside
    it (engine rules), else over every token."""
    starts = [r.second if r.second < r.length else 0 for r in rows]
    if any(starts):
        options["pooled_from"] = starts
    return model.embed([r.ids for r in rows], **options)


def _per_row(values: list, batch: list[_Row]) -> list[list]:
    """A per-token answer [T, ...] of packed rows as one list per row."""
    rows, start = [], 0
    for row in batch:
        rows.append(values[start : start + row.length])
        start += row.length
    return rows
