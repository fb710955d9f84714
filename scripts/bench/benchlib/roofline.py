"""The decode roofline: a decode step reads every weight once, so it cannot take
less than the weights' bytes over the memory's read bandwidth (measured here, one
thread reading a 256 MB array with numpy).
"""

import time

import numpy as np
from mlx import nn
from mlx.utils import tree_flatten

BANDWIDTH_BYTES = 256 * 1024 * 1024


def weight_bytes_per_token(float_model: nn.Module) -> int:
    """Bytes of weights one decode step reads: all of them, except that the
    embedding lookup reads one row of its table; a tied head reads the table."""
    total = sum(p.nbytes for _, p in tree_flatten(float_model.parameters()))
    table = float_model.model.embed_tokens.weight
    total -= table.nbytes - table.nbytes // table.shape[0]
    if float_model.args.tie_word_embeddings:
        total += table.nbytes
    return total


def read_bandwidth(passes: int = 7) -> float:
    """Bytes per second one thread reads from memory: the best of several passes over
    a 256 MB array, with a float32 max and with an int32 bitwise-or (about the least
    arithmetic per byte numpy can do), whichever is faster."""
    data = np.random.default_rng(0).random(BANDWIDTH_BYTES // 4, dtype=np.float32)
    reads = (data.max, lambda: np.bitwise_or.reduce(data.view(np.int32)))
    best = float("inf")
    for read in reads:
        read()
        for _ in range(passes):
            start = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - start)
    return data.nbytes / best
