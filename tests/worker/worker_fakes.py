"""Worker test helpers: a fake model with the sr.models API (counts and holds forwards) and
an in-process WorkerService runner."""

from __future__ import annotations

import contextlib
import json
import threading

import attrs
import torch
import trio

from sr.worker.options import WorkerOptions
from sr.worker.service import WorkerService


@attrs.frozen
class GoldenResult:
    status: str = "passed"
    reason: str | None = None
    max_abs_diff: float | None = 0.0


class FakeModel:
    """Rows -> small deterministic vectors. `invariant=False` makes answers depend on the
    batch's padded length, as a kernel that is not batch-invariant would."""

    weights_sha256 = "f" * 64
    device = "cpu"
    max_position_embeddings = 64
    embedding_dim = 4

    def __init__(self, *, invariant: bool = True, head_labels: list[str] | None = None) -> None:
        self.invariant = invariant
        self.head_labels = head_labels
        self.head_activation = "softmax" if head_labels else None
        self.batches: list[list[int]] = []  # row lengths of every forward, in order
        self.gate: threading.Event | None = None  # when set up, forwards wait for it
        self.fail_next = False

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [[101, *(1000 + sum(map(ord, w)) % 5000 for w in t.split()), 102] for t in texts]

    def truncate(self, ids: list[int], max_tokens: int) -> list[int]:
        return ids if len(ids) <= max_tokens else [*ids[: max_tokens - 1], 102]

    def _rows(self, batch: list[list[int]], width: int) -> torch.Tensor:
        if self.gate is not None and not self.gate.wait(timeout=10):
            raise TimeoutError("test gate never opened")
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        self.batches.append([len(r) for r in batch])
        longest = max(len(r) for r in batch)
        out = []
        for row in batch:
            values = [float(len(row)), float(sum(row) % 997), float(row[1]), 1.0][:width]
            values += [0.5] * (width - len(values))
            if not self.invariant:
                values[0] += 1e-3 * longest
            out.append(values)
        return torch.tensor(out, dtype=torch.float32)

    def embed(self, batch: list[list[int]]) -> torch.Tensor:
        return self._rows(batch, self.embedding_dim)

    def classify_logits(self, batch: list[list[int]]) -> torch.Tensor:
        return self._rows(batch, len(self.head_labels or []))


def passing_golden(model):
    return GoldenResult()


@contextlib.asynccontextmanager
async def running(options: WorkerOptions, **kwargs):
    """Run a WorkerService until the block ends; waits until it settles (bounded)."""
    service = WorkerService(options, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(15):
            await service.wait_settled()
        yield service
        nursery.cancel_scope.cancel()


async def card_entry(model_dir, threads: int, entry: str) -> dict:
    """One entry of the card of a real worker of `model_dir` at `threads` threads (golden
    check passed), the process's thread count restored after."""
    before = torch.get_num_threads()
    try:
        opts = WorkerOptions(artifact=str(model_dir), threads=threads)
        async with running(opts, golden_check_fn=passing_golden) as service:
            return service.card()[entry]
    finally:
        torch.set_num_threads(before)


async def post(service: WorkerService, path: str, body) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _headers, payload = await service.handle("POST", path, raw)
    return status, json.loads(payload)


async def get(service: WorkerService, path: str) -> tuple[int, dict]:
    status, _headers, payload = await service.handle("GET", path, b"")
    return status, json.loads(payload)


def fake_service_kwargs(model: FakeModel) -> dict:
    return {"load_model_fn": lambda options: model, "golden_check_fn": passing_golden}
