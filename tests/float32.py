"""Float32 reading of answers' floats: sr writes float32 vectors with 9 significant digits,
which read back as the model's float32 values; compared as float32, they are exact."""

from __future__ import annotations

import struct


def as_float32(values: list[float]) -> list[float]:
    """Each value rounded to the nearest float32 (IEEE binary32, by the struct module) and
    widened back to a Python float: what a float32 reader of sr's answer holds."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))
