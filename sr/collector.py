"""Python's cyclic garbage collector, paused while a process imports its heavy modules.

Importing torch makes ~300k objects, and the full collections their count sets off walk
all of them to free nothing: module-level objects live as long as the process. Measured on
the 2-core AMD host: torch's import 2.5 -> 2.2 s, sr's worker modules after it 0.42 -> 0.24
s. `imports_uncollected()` turns the collector off for a block of imports, then freezes
what the block made (`gc.freeze`: never walked again) and turns it back on, so what is made
later is collected as usual. The router's own imports do not use it: no full collection
runs in them, and pausing the collector moved their 0.29-0.44 s by 0.01-0.02 s (medians of
six pairs, within the noise); they are off the path to the first 200 anyway.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def imports_uncollected() -> Iterator[None]:
    """The block runs with the collector off; afterwards what exists is frozen and the
    collector is on again, however the block ended."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
