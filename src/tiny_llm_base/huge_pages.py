"""A model's weights on 2 MB pages (Linux): a decode step streams them with fewer TLB
misses.

A batch-1 decode step reads every weight once, 538 MB for the embedded model: about
131,000 pages of 4 KB, each a TLB miss the CPU walks before the stream goes on.
Linux backs memory with 2 MB pages ("transparent huge pages"), but under its common
default, `madvise`, only memory that asks for them, and MLX's arrays never ask.
`back_with_huge_pages` asks for arrays that already hold their data: madvise
MADV_COLLAPSE (Linux 6.1+) moves the pages under them into huge pages at once, on
the 2 MB-aligned parts of their spans (spans less than 2 MB apart are merged, so
weights allocated one after another collapse whole). It is best effort: on macOS,
an older kernel or with huge pages off it changes nothing and returns 0.

Measured (2026-12-03 05:28 UTC, a process each way in turn, three rounds): a batch-1
decode step of the embedded model's float32 weights 28.7 to 29.0 ms on 4 KB pages,
26.2 to 26.9 ms with 470 to 480 MB of them moved (about a second's work).
"""

import ctypes
import sys
from collections.abc import Iterable
from pathlib import Path

import mlx.core as mx
import numpy as np

from .kv_identity import model_state

HUGE_PAGE = 1 << 21
MADV_COLLAPSE = 25  # Linux 6.1+
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_offered() -> bool:
    """Whether this system may back memory with transparent huge pages (Linux, not
    switched off)."""
    if sys.platform != "linux":
        return False
    try:
        return "[never]" not in THP_MODE.read_text()
    except OSError:
        return False


def arrays_of(model) -> list[mx.array]:
    """Every mx.array reachable from `model` as kv_identity.model_state walks it
    (attributes but those named _like_this, lists, tuples, dicts), each once."""
    found = {id(v): v for _, v in model_state(model, "") if isinstance(v, mx.array)}
    return list(found.values())


def spans(arrays: Iterable[mx.array]) -> list[tuple[int, int]]:
    """The (address, bytes) of each array's data, merged where less than a huge page
    apart, in address order. An array whose memory Python cannot see is left out."""
    located = []
    for array in arrays:
        try:
            data = np.frombuffer(memoryview(array), dtype=np.uint8)
        except (BufferError, TypeError, ValueError):
            continue
        if data.nbytes:
            located.append((data.__array_interface__["data"][0], data.nbytes))
    merged: list[list[int]] = []
    for address, size in sorted(located):
        if merged and address - sum(merged[-1]) < HUGE_PAGE:
            merged[-1][1] = max(merged[-1][1], address + size - merged[-1][0])
        else:
            merged.append([address, size])
    return [(address, size) for address, size in merged]


def back_with_huge_pages(arrays: Iterable[mx.array]) -> int:
    """Bytes of the arrays' memory now on huge pages (evaluated first); 0 where the
    system offers none or the kernel cannot collapse (before Linux 6.1)."""
    arrays = list(arrays)
    if not huge_pages_offered():
        return 0
    mx.eval(arrays)
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    for address, size in spans(arrays):
        start = -(-address // HUGE_PAGE) * HUGE_PAGE
        end = (address + size) // HUGE_PAGE * HUGE_PAGE
        if end > start and madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += end - start
    return collapsed
