"""sr.worker.allocator in a fresh process each (mallopt changes the whole process): a tuned
malloc reuses a freed batch's pages instead of faulting them in again, the idle trimmer gives
them back, and SR_MALLOC=default leaves glibc's behaviour (fresh faults every time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sr.worker.allocator import glibc

pytestmark = pytest.mark.skipif(glibc() is None, reason="glibc only")

# Six 24 MB blocks written and freed by one thread (as the worker's device thread does),
# twice; then the process is left idle. Reports minor faults and anonymous memory.
PROBE = """
import ctypes, json, os, resource, sys, threading, time
from sr.settings import read_process_settings
from sr.worker import allocator

def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
BLOCK = 24 * 1000 * 1000

def batch():
    blocks = [libc.malloc(BLOCK) for _ in range(6)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    for block in blocks:
        libc.free(block)

if sys.argv[1] == "tune":  # configure_malloc's settings; its trimmer started below
    done = allocator.tune_malloc(allocator.glibc())
else:
    done = allocator.configure_malloc(read_process_settings().environ)
report = {"done": done, "base": anon_mib()}
report["trimmer"] = any(t.name == "sr-malloc-trim" for t in threading.enumerate())
def device_thread():  # one long-lived thread, as the worker's: one arena
    for name in ("first", "second"):
        before = faults()
        batch()
        report[name] = faults() - before

worker = threading.Thread(target=device_thread)
worker.start()
worker.join()
report["after"] = anon_mib()
if sys.argv[1] == "tune":  # the real trimmer, on a shorter clock, once the batches are done
    allocator.start_idle_trim(allocator.glibc(), idle_s=0.2, idle_cpu_s=0.05)
time.sleep(1.5)
report["idle"] = anon_mib()
print(json.dumps(report))
"""


def probe(how: str, malloc: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SR_MALLOC"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    if malloc is not None:
        env["SR_MALLOC"] = malloc
    done = subprocess.run(
        [sys.executable, "-c", PROBE, how], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tuned_malloc_reuses_a_freed_batch_and_gives_it_back_when_idle():
    tuned = probe("tune")
    assert tuned["done"] == "tuned" and not tuned["trimmer"]
    pages = 6 * 24 * 1000 * 1000 // os.sysconf("SC_PAGE_SIZE")
    assert tuned["first"] > pages // 2  # the first batch faults its pages in
    assert tuned["second"] < pages // 20  # the second reuses them
    assert tuned["after"] - tuned["base"] > 100  # kept while busy (MiB)
    # and given back once idle, all but the top of the thread's heap (malloc_trim releases
    # a thread arena's free chunks, not its top chunk)
    assert tuned["idle"] - tuned["base"] < (tuned["after"] - tuned["base"]) / 2


def test_sr_malloc_default_leaves_glibc_as_it_is():
    plain = probe("configure", "default")
    assert plain["done"] == "glibc defaults (SR_MALLOC=default)" and not plain["trimmer"]
    pages = 6 * 24 * 1000 * 1000 // os.sysconf("SC_PAGE_SIZE")
    assert plain["second"] > pages // 2  # every batch faults its blocks in again


def test_a_worker_start_tunes_malloc_and_starts_the_trimmer():
    started = probe("configure")
    assert started["done"] == "tuned" and started["trimmer"]
