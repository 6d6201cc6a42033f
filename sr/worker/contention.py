"""Yielding cores: a CPU worker configured for several threads serves a forward at fewer
while the host's other work holds cores it would need.

Why. A forward's threads meet at a barrier after every operator, so a forward runs at the
pace of its slowest thread. When another process holds a core, the thread that shares it
waits for its turn at every operator: on a 2-core host with one busy process, one medium
text at 2 threads took 80-160 ms with libgomp spinning 20k-300k times before sleeping, and
43 ms at 1000 spins, where one thread takes 33. Spinning little cures the loaded host and
slows the quiet one: a forward after an idle pause at 1000 spins runs at one core's pace
(43 ms against 22-25 at 20k), its peer asleep between operators. With yielding, workers
spin 20k times (sr.pool.replica) and a loaded host's forwards run at the threads it has
free (docs/benchmarks-history.md, "Yielding cores").

Rules:
* Only CPU workers whose configured count is above 1, in adaptive mode 0 (in modes 1 and
  2 the learner chooses counts), and only counts whose forwards the start-up check found
  bit-identical to the configured count's on its probe rows: yielding never changes an
  answer (sr.worker.warmup.thread_count_probe).
* The other work, in cores, is (busy time of the CPUs this process may use - this
  process's CPU time) / wall time between two samples of /proc/stat. It counts in 10 ms
  ticks, so a sample is taken only when SAMPLE_S has passed since the last; between
  samples the choice holds.
* A forward runs at the largest allowed count not above `cpus - other work + SLACK_CORES`
  (at least the smallest allowed), else at the configured count.

`YieldPolicy` is pure (samples in, a count out); `CoreYield` reads the samples.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable

import attrs

SAMPLE_S = 0.05
# Free cores a forward may be short of before it yields: half a core of someone else's
# work (the router's share, a log shipper) is not worth dropping a thread for.
SLACK_CORES = 0.5
STAT_PATH = "/proc/stat"


@attrs.frozen
class CpuSample:
    wall_s: float
    host_busy_s: float  # every CPU's non-idle time since boot
    own_cpu_s: float  # this process's CPU time


class YieldPolicy:
    """Which count the next forward runs at, from samples of the host's CPU time."""

    def __init__(self, configured: int, allowed: Iterable[int], cpus: int) -> None:
        self.configured = configured
        self.allowed = sorted(set(allowed) | {configured})
        self.cpus = cpus
        self.serving = configured
        self._last: CpuSample | None = None

    def due(self, wall_s: float) -> bool:
        return self._last is None or wall_s - self._last.wall_s >= SAMPLE_S

    def observe(self, sample: CpuSample) -> int:
        """Take a sample; the count to serve at until the next one."""
        last = self._last
        if last is not None and sample.wall_s - last.wall_s < SAMPLE_S:
            return self.serving
        self._last = sample
        if last is None:
            return self.serving
        others = (sample.host_busy_s - last.host_busy_s) - (sample.own_cpu_s - last.own_cpu_s)
        others_cores = max(0.0, others / (sample.wall_s - last.wall_s))
        room = math.floor(self.cpus - others_cores + SLACK_CORES)
        fitting = [count for count in self.allowed if count <= room]
        self.serving = fitting[-1] if fitting else self.allowed[0]
        return self.serving


class CoreYield:
    """The I/O side: samples /proc/stat and this process's CPU time when the policy asks."""

    def __init__(
        self,
        policy: YieldPolicy,
        read_host_busy: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._read_host_busy = read_host_busy
        self._clock = clock
        self.yielded = 0  # forwards run below the configured count

    def threads(self) -> int:
        now = self._clock()
        if self.policy.due(now):
            sample = CpuSample(now, self._read_host_busy(), time.process_time())
            self.policy.observe(sample)
        if self.policy.serving < self.policy.configured:
            self.yielded += 1
        return self.policy.serving

    def card(self) -> dict:
        return {
            "counts": self.policy.allowed,
            "serving": self.policy.serving,
            "yielded_forwards": self.yielded,
        }


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity: a container's cpuset, a taskset);
    empty where the platform cannot say (then nothing is readable and nothing yields)."""
    if not hasattr(os, "sched_getaffinity"):
        return frozenset()
    return frozenset(os.sched_getaffinity(0))


def host_busy_seconds(cpus: frozenset[int], path: str = STAT_PATH) -> float:
    """The non-idle time since boot of `cpus`, from their `cpuN` lines of /proc/stat: user,
    nice, system, irq, softirq and steal (guest time is inside user and nice already).
    Only these CPUs: work elsewhere on the host takes nothing from this process."""
    busy = 0
    with open(path, "rb") as stat:
        for line in stat:
            if not line.startswith(b"cpu"):
                break  # the cpu lines come first
            name, *values = line.split()
            if name != b"cpu" and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values[:8])
                busy += user + nice + system + irq + softirq + steal
    return busy * _TICK_S


def host_cpu_unreadable(cpus: frozenset[int], path: str = STAT_PATH) -> str | None:
    """Why the CPU time of `cpus` cannot be read here; None when it can."""
    try:
        if host_busy_seconds(cpus, path) <= 0:
            return f"{path}: no busy time for CPUs {sorted(cpus)}"
    except (OSError, ValueError, IndexError) as error:
        return f"{path}: {type(error).__name__}: {error}"
    return None
