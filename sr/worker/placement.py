"""Keeping a forward's OpenMP peers off the CPU of the thread that runs it.

Why. torch runs each operator of a multi-thread forward as an OpenMP parallel region: the
device thread is member 0 of the team, libgomp's pool threads (the peers) are the others,
and all of them meet at a barrier after every region, spinning GOMP_SPINCOUNT times before
they sleep. Traced with `perf sched` on a 2-vCPU VM (docs/benchmarks-history.md, "OpenMP peers
after idleness"): after an idle pause Linux woke the sleeping peer on the device thread's
own CPU, not on the idle one (likely because an idle virtual CPU reports itself preempted
and the scheduler's idle-CPU search skips it; the trace shows the effect, not the cause),
and the two threads then took turns on that
CPU, each spinning ~0.5 ms at every barrier while the other waited: one short text took
11-21 ms at 2 threads against 4-5 ms back to back. Kept off the device thread's CPU, the
peer is woken where it may run.

Rules:
* Only CPU workers configured for 2 or more threads, with libgomp as torch's OpenMP
  runtime, no OpenMP binding in force (`omp_get_proc_bind`: an operator's OMP_PROC_BIND or
  OMP_PLACES wins) and 2 or more CPUs in the process's affinity.
* The peers are found once: one parallel region of the largest count the worker runs,
  started through libgomp's own entry point (GOMP_parallel) on the device thread, whose
  body records each member's thread id. torch's regions from that thread reuse the same
  pool threads (the test checks that a forward starts no new thread).
* Before each forward at 2 or more threads, when the device thread's CPU (sched_getcpu)
  is not the one the peers were last kept off, each peer's affinity becomes the process's
  CPUs less that one: a system call per peer only when the device thread has moved.
* Placement never changes an answer: which CPU runs a thread changes no arithmetic. Nor
  does it fail a forward: the process's CPUs are read at each move (a container's cpuset
  may change), and a placement the kernel refuses stops, saying why in the card.
* Peers are kept off one CPU, not pinned one per CPU: workers that share a host's CPUs
  would all pin their peers in the same order and collide.

`peer_cpus` is pure; `PeerPlacement` makes the system calls; `openmp_team` finds the peers.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

from sr.worker.contention import usable_cpus

# libgomp's omp_proc_bind_t: 0 is omp_proc_bind_false (threads are not bound).
_PROC_BIND_FALSE = 0


def peer_cpus(cpus: frozenset[int], device_cpu: int) -> frozenset[int]:
    """Where the peers may run: the process's CPUs less the device thread's (all of them
    when the device thread runs outside the set, which an affinity change can cause)."""
    rest = cpus - {device_cpu}
    return rest if rest else cpus


class PeerPlacement:
    """Keeps `peers` (thread ids) off the CPU the calling thread runs on."""

    def __init__(
        self,
        peers: list[int],
        *,
        current_cpu: Callable[[], int],
        usable_cpus: Callable[[], frozenset[int]],
        set_affinity: Callable[[int, frozenset[int]], None] = os.sched_setaffinity,
    ) -> None:
        self.peers = list(peers)
        self._current_cpu = current_cpu
        self._usable_cpus = usable_cpus
        self._set_affinity = set_affinity
        self._kept_off: int | None = None
        self.moves = 0  # how often the peers were placed anew
        self.stopped: str | None = None  # why placement stopped, if it did

    def before_forward(self) -> None:
        if self.stopped is not None:
            return
        cpu = self._current_cpu()
        if cpu == self._kept_off:
            return
        try:
            self._place(cpu)
        except OSError as error:  # a placement the kernel refuses stops, never the forward
            self.stopped = f"{type(error).__name__}: {error}"
            return
        self._kept_off = cpu
        self.moves += 1

    def _place(self, cpu: int) -> None:
        # Read at each move: the process's CPUs may change under it (a container's cpuset).
        allowed = peer_cpus(self._usable_cpus(), cpu)
        for peer in self.peers:
            try:
                self._set_affinity(peer, allowed)
            except ProcessLookupError:
                pass  # a pool thread that exited: nothing left to place

    def card(self) -> dict:
        card = {"peers": len(self.peers), "moves": self.moves}
        return card if self.stopped is None else {**card, "stopped": self.stopped}


def _loaded_libraries(fragment: str) -> set[str]:
    """The paths of the loaded shared libraries whose names contain `fragment`."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split()[-1] for line in maps if fragment in line and "/" in line}
    except OSError:
        return set()


def openmp_team(threads: int) -> tuple[list[int] | None, str]:
    """The thread ids of the calling thread's OpenMP team members 1..threads-1 (libgomp's
    pool threads that torch's regions of this many threads use), or None; and why."""
    import torch  # noqa: F401 (loads libgomp, torch's OpenMP runtime)

    paths = _loaded_libraries("libgomp")
    if len(paths) != 1:
        # none: torch uses another OpenMP runtime; several: which one torch uses is unknown
        return None, f"{len(paths)} copies of libgomp loaded, not one"
    gomp = ctypes.CDLL(paths.pop())
    gomp.omp_get_proc_bind.restype = ctypes.c_int
    if gomp.omp_get_proc_bind() != _PROC_BIND_FALSE:
        return None, "OpenMP binds its threads itself (OMP_PROC_BIND or OMP_PLACES)"
    gomp.omp_get_thread_num.restype = ctypes.c_int
    gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp.GOMP_parallel.restype = None
    members: dict[int, int] = {}
    lock = threading.Lock()

    # Runs once on each member of the team, the GIL taken by ctypes around the call.
    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def record(_data: int | None) -> None:
        number = gomp.omp_get_thread_num()
        with lock:
            members[number] = threading.get_native_id()

    gomp.GOMP_parallel(ctypes.cast(record, ctypes.c_void_p), None, threads, 0)
    peers = [members[n] for n in sorted(members) if n != 0]
    if len(peers) != threads - 1:
        return None, f"libgomp started {len(peers) + 1} of {threads} threads"
    return peers, f"{len(peers)} OpenMP peer thread(s) kept off the device thread's CPU"


def _sched_getcpu() -> Callable[[], int]:
    libc = ctypes.CDLL(None, use_errno=True)
    getcpu = libc.sched_getcpu
    getcpu.restype = ctypes.c_int
    getcpu.argtypes = []
    return getcpu


def placement_for(threads: int) -> tuple[PeerPlacement | None, str]:
    """A PeerPlacement for forwards of up to `threads` threads started on the calling
    thread (the device thread), or None; and why. Starts the OpenMP pool if not started."""
    if threads < 2:
        return None, "1 thread configured"
    if len(usable_cpus()) < 2:  # empty where the platform has no CPU affinity
        return None, "fewer than 2 CPUs usable (or the platform cannot say)"
    try:
        current_cpu = _sched_getcpu()
        if current_cpu() < 0:
            return None, f"sched_getcpu failed: {os.strerror(ctypes.get_errno())}"
    except (AttributeError, OSError) as error:
        return None, f"sched_getcpu is unavailable: {error}"
    peers, detail = openmp_team(threads)
    if peers is None:
        return None, detail
    return PeerPlacement(peers, current_cpu=current_cpu, usable_cpus=usable_cpus), detail
