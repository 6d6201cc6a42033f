"""Keeping a forward's OpenMP peers off the device thread's CPU (sr.worker.placement): the
pure rule, the placement's system calls through fakes, the team found through libgomp on
this host, the runner's seam and a real worker's card."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from sr.worker.placement import PeerPlacement, openmp_team, peer_cpus, placement_for
from sr.worker.threads import ForwardRunner

TWO_CPUS = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="one usable CPU: no other CPU to keep peers on"
)


def test_peers_may_run_on_every_cpu_but_the_device_threads():
    assert peer_cpus(frozenset({0, 1}), 0) == {1}
    assert peer_cpus(frozenset({0, 1, 2, 3}), 2) == {0, 1, 3}
    # outside the set (an affinity changed under the worker): nothing to leave out
    assert peer_cpus(frozenset({0, 1}), 5) == {0, 1}
    # a single CPU: the peers cannot be kept off it
    assert peer_cpus(frozenset({3}), 3) == {3}


class _Host:
    """The device thread's CPU, the process's CPUs and each thread's affinity, as the
    placement reads and sets them."""

    def __init__(self, cpus: set[int]) -> None:
        self.cpu = 0
        self.cpus = frozenset(cpus)
        self.affinity: dict[int, frozenset[int]] = {}
        self.calls = 0
        self.gone: set[int] = set()

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        self.calls += 1
        if tid in self.gone:
            raise ProcessLookupError(tid)
        if not cpus <= self.cpus:
            raise OSError(22, "Invalid argument")
        self.affinity[tid] = frozenset(cpus)

    def placement(self, peers: list[int]) -> PeerPlacement:
        return PeerPlacement(
            peers, current_cpu=lambda: self.cpu, usable_cpus=lambda: self.cpus,
            set_affinity=self.set_affinity,
        )  # fmt: skip


def test_peers_move_only_when_the_device_thread_has_moved():
    host = _Host({0, 1, 2})
    placement = host.placement([11, 12])
    placement.before_forward()
    assert host.affinity == {11: {1, 2}, 12: {1, 2}} and host.calls == 2
    placement.before_forward()  # same CPU: no system call
    assert host.calls == 2
    host.cpu = 2
    placement.before_forward()
    assert host.affinity == {11: {0, 1}, 12: {0, 1}} and host.calls == 4
    assert placement.card() == {"peers": 2, "moves": 2}


def test_a_peer_that_has_exited_does_not_stop_the_others():
    host = _Host({0, 1})
    host.gone.add(11)
    host.placement([11, 12]).before_forward()
    assert host.affinity == {12: {1}}


def test_the_processs_cpus_are_read_at_each_move():
    host = _Host({0, 1, 2, 3})
    placement = host.placement([11])
    placement.before_forward()
    assert host.affinity == {11: {1, 2, 3}}
    host.cpus, host.cpu = frozenset({2, 3}), 2  # a container's cpuset shrank
    placement.before_forward()
    assert host.affinity == {11: {3}}


def test_a_placement_the_kernel_refuses_stops_and_the_forward_goes_on():
    host = _Host({0, 1})
    placement = PeerPlacement(
        [11], current_cpu=lambda: host.cpu, usable_cpus=lambda: frozenset({0, 1, 7}),
        set_affinity=host.set_affinity,
    )  # fmt: skip
    placement.before_forward()  # CPU 7 is not the process's: EINVAL
    assert placement.stopped == "OSError: [Errno 22] Invalid argument"
    host.cpu = 1
    placement.before_forward()  # stopped: no more system calls
    assert host.calls == 1
    assert placement.card() == {"peers": 1, "moves": 0, "stopped": placement.stopped}


class _CountingPlacement:
    def __init__(self) -> None:
        self.forwards = 0

    def before_forward(self) -> None:
        self.forwards += 1


def test_the_runner_places_peers_before_each_forward_of_two_or_more_threads():
    before = torch.get_num_threads()
    try:
        for threads, expected in ((2, 1), (1, 0)):
            runner = ForwardRunner(threads)
            placement = _CountingPlacement()
            runner.place_peers(placement)  # type: ignore[arg-type]
            assert runner.run(torch.get_num_threads, 10) == threads
            assert placement.forwards == expected
    finally:
        torch.set_num_threads(before)


def _in_fresh_thread(fn):
    """`fn()` on a new thread: libgomp keeps one pool per thread that starts a region, so
    a fresh thread's team is not one an earlier test left behind."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as error:  # handed back to the test
            out["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _tasks() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _cpu_ticks(tid: int) -> int:
    """utime + stime of one thread of this process, in clock ticks."""
    with open(f"/proc/self/task/{tid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@TWO_CPUS
def test_the_team_found_is_the_one_torch_runs_its_regions_on():
    def check():
        torch.set_num_threads(2)
        me = threading.get_native_id()
        peers, detail = openmp_team(2)
        assert peers is not None, detail
        assert len(peers) == 1 and peers[0] != me and peers[0] in _tasks()
        time.sleep(0.3)  # the peer stops spinning after the discovery region, then sleeps
        before, peer_cpu = _tasks(), _cpu_ticks(peers[0])
        x = torch.randn(256, 1024)
        deadline = time.monotonic() + 10
        # parallel regions of 2 threads (above torch's grain size) until the peer has
        # computed for a clock tick: torch's work ran on the thread found
        while _cpu_ticks(peers[0]) == peer_cpu:
            assert time.monotonic() < deadline, "the peer found never ran torch's work"
            for _ in range(20):
                x = (x * 1.0001).exp().log()
        # and no new thread: torch's regions use the team found
        assert _tasks() - before == set()
        return peers

    _in_fresh_thread(check)


@TWO_CPUS
def test_a_placement_keeps_the_peer_off_the_device_threads_cpu():
    cpus = frozenset(os.sched_getaffinity(0))

    def check():
        torch.set_num_threads(2)
        placement, detail = placement_for(2)
        assert placement is not None, detail
        placement.before_forward()
        (peer,) = placement.peers
        allowed = os.sched_getaffinity(peer)
        assert allowed and allowed < cpus
        assert len(cpus - allowed) == 1  # exactly one CPU left out: the device thread's
        return detail

    assert "kept off the device thread's CPU" in _in_fresh_thread(check)


@TWO_CPUS
def test_placed_peers_give_the_same_bits(tiny_model_dir):
    from sr.models import load_model

    model = load_model(tiny_model_dir)
    rows = model.tokenize(["a text to embed", "another, somewhat longer text to embed here"])

    def check():
        torch.set_num_threads(2)
        unplaced = model.embed(rows)
        placement, detail = placement_for(2)
        assert placement is not None, detail
        placement.before_forward()
        return unplaced, model.embed(rows)

    unplaced, placed = _in_fresh_thread(check)
    assert torch.equal(unplaced.view(torch.int32), placed.view(torch.int32))


@TWO_CPUS
def test_an_operators_openmp_binding_wins():
    """libgomp reads OMP_PROC_BIND as torch loads: a process of its own."""
    import subprocess
    import sys

    code = "from sr.worker.placement import placement_for; print(placement_for(2)[1])"
    env = {**os.environ, "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OpenMP binds its threads itself (OMP_PROC_BIND or OMP_PLACES)"


def test_one_thread_has_no_peers_to_place():
    assert placement_for(1) == (None, "1 thread configured")


@pytest.mark.parametrize("threads", [1, 2])
async def test_the_card_says_whether_the_worker_places_its_peers(tiny_model_dir, threads):
    from worker_fakes import card_entry

    card = await card_entry(tiny_model_dir, threads, "cpu_placement")
    if threads == 1:
        assert card == {"enabled": False, "reason": "1 thread configured"}
    elif len(os.sched_getaffinity(0)) < 2:
        assert card["enabled"] is False
    else:
        assert card["enabled"] is True and card["peers"] == 1
        assert card["moves"] >= 1  # the warm-up's forwards at 2 threads placed it
