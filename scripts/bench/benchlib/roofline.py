"""The decode roofline and model bandwidth utilization (MBU).

A decode step reads every weight once and every cached key and value of its rows,
so it cannot take less than those bytes over the memory's read bandwidth. MBU is the
share of that bandwidth a measured step rate uses:

    MBU = bytes per step * steps per second / read bandwidth

The bandwidth is measured here with numpy: one thread reading a 256 MB array, and
the whole machine, the same read split over os.cpu_count() threads (numpy's
reductions release the GIL). The larger is the denominator, so an MBU never counts
bandwidth a second thread could have added as unused by the first. Where the system
offers huge pages (tiny_llm_base/huge_pages.py, which serve's weights move onto),
the same reads run on an array of 2 MB pages too, and the faster counts: a model
read from huge pages is measured against what huge pages allow.
"""

import mmap
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

from tiny_llm_base.huge_pages import huge_pages_offered

BANDWIDTH_BYTES = 256 * 1024 * 1024
KV_ITEM_BYTES = 4  # the float32 cache of the float32 model


def weight_bytes_per_token(float_model: nn.Module) -> int:
    """Bytes of weights one decode step reads: all of them, except that the
    embedding lookup reads one row of its table; a tied head reads the table.
    (A step of several rows reads a row each: under 0.01% more, not counted.)"""
    total = sum(p.nbytes for _, p in tree_flatten(float_model.parameters()))
    table = float_model.model.embed_tokens.weight
    total -= table.nbytes - table.nbytes // table.shape[0]
    if float_model.args.tie_word_embeddings:
        total += table.nbytes
    return total


def kv_bytes_per_step(args, context: float, rows: int = 1) -> float:
    """Bytes of keys and values a decode step reads: `rows` rows attending to
    `context` positions each, a key and a value [kv_heads, head_dim] per position
    and layer, KV_ITEM_BYTES an element. args: the model's (mlx-lm ModelArgs)."""
    head_dim = getattr(args, "head_dim", None) or (
        args.hidden_size // args.num_attention_heads
    )
    per_position = 2 * args.num_hidden_layers * args.num_key_value_heads * head_dim
    return per_position * KV_ITEM_BYTES * context * rows


def bytes_per_step(float_model: nn.Module, context: float, rows: int = 1) -> float:
    """What a decode step of `rows` rows at `context` positions reads: the weights
    once, and each row's cache."""
    return weight_bytes_per_token(float_model) + kv_bytes_per_step(
        float_model.args, context, rows
    )


def mbu(step_bytes: float, steps_per_s: float, bandwidth: float) -> float:
    """The share of `bandwidth` (bytes/s) that `steps_per_s` steps of `step_bytes`
    each use."""
    return step_bytes * steps_per_s / bandwidth


def fastest(read: Callable[[], object], passes: int) -> float:
    """The least seconds of `passes` calls of `read`, after one untimed."""
    read()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - start)
    return best


def read_array() -> np.ndarray:
    return np.random.default_rng(0).random(BANDWIDTH_BYTES // 4, dtype=np.float32)


def on_huge_pages(values: np.ndarray) -> np.ndarray:
    """A copy of `values` on 2 MB pages (Linux: memory advised MADV_HUGEPAGE before
    it is first written)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    memory = mmap.mmap(-1, values.nbytes, flags=flags)
    memory.madvise(mmap.MADV_HUGEPAGE)
    data = np.frombuffer(memory, dtype=values.dtype)
    data[:] = values
    return data


# A float32 max and an int32 bitwise-or: about the least arithmetic per byte numpy
# can do; whichever is faster counts.
READS = (np.max, lambda part: np.bitwise_or.reduce(part.view(np.int32)))


def read_bandwidth(data: np.ndarray, passes: int = 7) -> float:
    """Bytes per second one thread reads from memory: the best of several passes over
    `data` (read_array's 256 MB), with either of READS, whichever is faster."""
    best = min(fastest(lambda r=r: r(data), passes) for r in READS)
    return data.nbytes / best


def machine_read_bandwidth(
    data: np.ndarray, passes: int = 7, threads: int | None = None
) -> float:
    """Bytes per second the whole machine reads: `data` split into `threads` parts
    (os.cpu_count()), each part read by a thread of its own."""
    threads = threads or os.cpu_count() or 1
    parts = np.array_split(data, threads)
    with ThreadPoolExecutor(threads) as pool:
        best = min(fastest(lambda r=r: list(pool.map(r, parts)), passes) for r in READS)
    return data.nbytes / best


@dataclass
class Bandwidth:
    """Measured read bandwidths, bytes/s: one thread's and `threads` threads'."""

    one_thread: float
    machine: float
    threads: int
    # What the reads ran on: "4 KB pages", or "the best of 4 KB and 2 MB pages".
    pages: str = "4 KB pages"

    @property
    def best(self) -> float:
        """The denominator of an MBU: the larger."""
        return max(self.one_thread, self.machine)

    def line(self) -> str:
        return (
            f"read bandwidth {self.one_thread / 1e9:.1f} GB/s on one thread, "
            f"{self.machine / 1e9:.1f} GB/s on {self.threads} threads ({self.pages}): "
            f"MBU counts against {self.best / 1e9:.1f} GB/s"
        )

    def record(self) -> dict:
        return {
            "one_thread_bytes_per_s": self.one_thread,
            "machine_bytes_per_s": self.machine,
            "threads": self.threads,
            "denominator_bytes_per_s": self.best,
            "pages": self.pages,
        }


def measure_bandwidth(passes: int = 7) -> Bandwidth:
    """One thread's and every core's read bandwidth, each the faster on 4 KB pages
    and, where the system offers them, on 2 MB pages."""
    threads = os.cpu_count() or 1
    huge = huge_pages_offered() and hasattr(mmap, "MADV_HUGEPAGE")
    data = read_array()
    arrays = [data, on_huge_pages(data)] if huge else [data]
    return Bandwidth(
        max(read_bandwidth(data, passes) for data in arrays),
        max(machine_read_bandwidth(data, passes, threads) for data in arrays),
        threads,
        "the best of 4 KB and 2 MB pages" if huge else "4 KB pages",
    )
