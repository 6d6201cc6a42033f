"""What a deployment's fork server does before it forks: load and pack the model once.

Run inside the child that sr.pool.forkserver forks for a `model_server` request. Replicas
forked after `preload` find the model in sr.worker.preloaded and serve it instead of
loading their own, so its weights, the packed oneDNN copies included (private per process
when each worker packs at load), are copy-on-write pages shared by every replica.

Rules:
* The model is the one the worker argv would load: the argv is parsed by `sr worker`'s
  parser and the dtype resolved as the worker resolves it (sr.config.precision), so the
  worker's claim (artifact, revision, device, dtype served, kernel) matches. CPU only.
* No OpenMP thread may exist in a process that forks (libgomp's pool does not survive a
  fork). torch runs at 1 thread here, where operators run inline and start no pool, and
  the thread count is checked (/proc/self/task) before answering ready and before each
  fork. The kernel probe (sr.models.linear.choose_kernel) runs products at 1 and 2 threads,
  so it runs in a short-lived child forked for it, at the thread count a fresh worker has,
  which reports its choice on a pipe and exits; this process adopts the choice. The
  choice is kept on disk per host (sr.models.probe_cache), so only a host's first start
  probes, and it loads the model on oneDNN (the usual answer) while the child runs,
  loading it again only where the probe chooses BLAS.
* Every check a worker makes at start still runs in each replica, on the shared model: the
  golden check, the batching probe, thread calibration (the first two from what is kept per
  host where the replica's golden answers match it: sr.worker.kept_checks). Each replica
  sets its own threads. The one exception is the cut-off at 1 thread, found here at load: a
  replica at 1 thread inherits it instead of measuring it. Like the kernel choice it is kept
  on disk per host (sr.models.probe_cache); a host's first start measures the model's shapes
  side by side, one per core (sr.models.gemm_rows.measure_many: MiniLM's take 0.29 s one
  after another).
"""

from __future__ import annotations

import json
import os
import time
import traceback

import attrs
import torch

from sr.config.precision import cpu_flags, resolve_precision
from sr.models import gemm_rows, kernels, linear, probe_cache
from sr.models.blocks import torch_dtype
from sr.models.encoder import torch_device
from sr.settings import host_cache_dir, native_library_variables
from sr.worker import preloaded
from sr.worker.cli import parse_command
from sr.worker.service import load_from_artifact

PROBE_REPORT_MAX = 1 << 16


def preload(argv: list[str]) -> dict:
    """Load the model `argv` (`python -m sr worker ...`) serves and offer it to the workers
    this process forks; returns what the ready message tells the router."""
    started = time.perf_counter()
    # The router sends the argv less what differs between replicas (sr.pool.forked.model_key:
    # no socket, no pipe); the server listens nowhere, but the worker's parser wants an
    # address.
    options = parse_command([*argv[4:], "--uds", "unused"]).options
    if options.device != "cpu":
        raise ValueError(f"only CPU workers are forked, not {options.device}")
    precision = resolve_precision(
        options.profile, options.dtype, options.device, cpu_flags=cpu_flags(), gpu_bf16=False,
        engine=options.engine,
    )  # fmt: skip
    served = attrs.evolve(options, dtype=precision.dtype)
    fresh_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    device = torch_device(served.device)
    dtypes = {torch_dtype(served.dtype), torch.float32}  # float32: Dense modules
    choices: dict[torch.dtype, _HostChoice] = {}
    if served.kernel != kernels.BLAS:  # "blas" is never probed
        for dtype in dtypes:
            choices[dtype] = _HostChoice.start(device, dtype, fresh_threads)
            linear.adopt_choice(device, dtype, choices[dtype].guess)
        kernels.bound_onednn_caches()  # before packing creates the first oneDNN primitive
    model = load_from_artifact(served)
    # A host's first start loads on the likely kernel while the probe's child runs; where
    # the probe answers otherwise (rare: oneDNN's rows or threads disagreeing), the model
    # is loaded again on the kernel it chose.
    answers = {dtype: choice.finish() for dtype, choice in choices.items()}
    for dtype, answer in answers.items():
        linear.adopt_choice(device, dtype, answer)
    if any(answers[dtype].linear != choice.guess.linear for dtype, choice in choices.items()):
        del model
        model = load_from_artifact(served)
    else:
        _card_probe_answer(model, choices, answers)
    # The 1-thread cut-offs, found here so that replicas at 1 thread inherit them.
    _calibrate(model, device, dtypes)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError(f"loading the model left {threads} threads; forking needs 1")
    preloaded.offer(served, model)
    card = getattr(model, "kernel_card", None)
    return {"kernel": card, "load_s": round(time.perf_counter() - started, 3)}


@attrs.define
class _HostChoice:
    """The kernel probe's answer for this host: the one kept from an earlier start
    (sr.models.probe_cache), else probed in a child that runs meanwhile. `guess`: the
    answer the model is loaded on until `finish` (called once) has the probe's."""

    guess: linear.KernelChoice
    key: str  # the probe cache's key for this host, device, dtype and thread count
    probe: _ProbeChild | None = None

    @classmethod
    def start(cls, device: torch.device, dtype: torch.dtype, threads: int) -> _HostChoice:
        key = probe_cache.probe_key(device, dtype, threads, native_library_variables())
        kept = probe_cache.load(probe_cache.cache_file(host_cache_dir()), key)
        if kept is not None:
            reason = f"{kept['reason']} (probed at an earlier start)"
            return cls(linear.KernelChoice(kept["linear"], reason), key)
        unavailable = kernels.onednn_unavailable(device, dtype)
        if unavailable is not None:  # the probe's own first answer, without a child
            return cls(linear.KernelChoice(kernels.BLAS, unavailable), key)
        guess = linear.KernelChoice(kernels.ONEDNN, "loaded while the probe ran")
        return cls(guess, key, _ProbeChild.start(device, dtype, threads))

    def finish(self) -> linear.KernelChoice:
        """The probe's answer, kept on disk for later starts, once its child reported; the
        guess where no child ran."""
        if self.probe is None:
            return self.guess
        answer = self.probe.wait()
        probe_cache.store(probe_cache.cache_file(host_cache_dir()), self.key, answer.card())
        return answer


def _card_probe_answer(model, choices: dict, answers: dict) -> None:
    """The model's kernel card with the probe's own reason where it was loaded on the
    guess the probe then confirmed."""
    backbone = getattr(model, "backbone", None)
    for dtype, choice in choices.items():
        if getattr(backbone, "kernel", None) == choice.guess:
            backbone.kernel = answers[dtype]


def _calibrate(model, device: torch.device, dtypes: set[torch.dtype]) -> None:
    """`model`'s cut-offs at 1 thread (sr.models.gemm_rows), from an earlier start of this
    host where kept (sr.models.probe_cache), else measured now and kept."""
    path = probe_cache.cut_off_file(host_cache_dir())
    native = native_library_variables()
    bases = {dtype: probe_cache.probe_key(device, dtype, 1, native) for dtype in dtypes}
    kept = {
        (*shape, dtype): rows
        for dtype, base in bases.items()
        for shape, rows in probe_cache.load_cut_offs(path, base).items()
    }
    gemm_rows.adopt(device, 1, kept)
    # What is not kept is measured one shape per core at once (all of them at a host's
    # first start), then found by the model's own calibration.
    keys = getattr(model, "product_keys", None)
    if keys is not None:
        gemm_rows.measure_many(device, keys(), workers=len(os.sched_getaffinity(0)))
    model.calibrate_threads()
    measured = gemm_rows.measured_at(device, 1)
    new = {
        probe_cache.cut_off_key(bases[dtype], in_features, out_features, kernel): rows
        for (in_features, out_features, kernel, dtype), rows in measured.items()
        if dtype in bases and (in_features, out_features, kernel, dtype) not in kept
    }
    probe_cache.store_cut_offs(path, new)


@attrs.define
class _ProbeChild:
    """The host's kernel choice, probed in a child that exits after reporting it on a pipe,
    so the probe's OpenMP threads never exist in this process."""

    pid: int
    read_end: int

    @classmethod
    def start(cls, device: torch.device, dtype: torch.dtype, threads: int) -> _ProbeChild:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_end)
                torch.set_num_threads(threads)  # the count the worker's own probe would run at
                choice = linear.choose_kernel(device, dtype)
                os.write(write_end, json.dumps(attrs.asdict(choice)).encode())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write_end)
        return cls(pid, read_end)

    def wait(self) -> linear.KernelChoice:
        with os.fdopen(self.read_end, "rb") as report:
            data = report.read(PROBE_REPORT_MAX)
        _, status = os.waitpid(self.pid, 0)
        if not data:
            code = os.waitstatus_to_exitcode(status)
            raise RuntimeError(f"the kernel probe's child exited {code} without a choice")
        return linear.KernelChoice(**json.loads(data))
