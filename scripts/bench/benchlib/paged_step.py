"""One paged decode step of the model at chosen row lengths: the pool's blocks hold
random keys and values (a decode step's cost does not depend on what they are), so
a 6,000-token row needs no 6,000-token prefill.

    batch = paged_batch(model, [6000, 200, 200, 200])
    seconds = decode_step(model, batch)           # one forward, evaluated
    with padded():                                # the baseline: every row read
        seconds = decode_step(model, batch)       # to the longest row's length
    with blas_threads(2):                         # OpenBLAS on 2 threads
        seconds = decode_step(model, batch)
"""

import time
from contextlib import contextmanager

import mlx.core as mx

from tiny_llm_base import fast_blas
from scripts.bench.benchlib.course import course

BLOCK_SIZE = 16
ROOM = 64  # positions past each row's length: the steps a benchmark may time


def paged_batch(model, lengths: list[int], kv_dtype: str = "float32") -> list:
    """One PagedBatchingKvCache per layer, row i holding lengths[i] positions of
    random keys and values in its own blocks, stored as kv_dtype says."""
    layers = model.create_kv_cache()
    H = model.args.num_key_value_heads
    D = model.args.hidden_size // model.args.num_attention_heads
    tables, first = [], 0
    for length in lengths:
        count = course.blocks_needed(length + ROOM, BLOCK_SIZE)
        tables.append(course.BlockTable(list(range(first, first + count))))
        first += count
    batch = []
    for _ in layers:
        shape = (first, H, BLOCK_SIZE, D)
        keys, values = (mx.random.normal(shape) * 0.5 for _ in range(2))
        if kv_dtype == "float32":
            blocks = course.LayerBlocks(first, BLOCK_SIZE)
        else:
            blocks = course.QuantizedLayerBlocks(first, BLOCK_SIZE, kv_dtype)
            keys, values = blocks.encode(keys), blocks.encode(values)
        blocks.keys, blocks.values = keys, values
        cache = course.PagedBatchingKvCache(len(lengths), max(lengths) + ROOM)
        for slot, (table, length) in enumerate(zip(tables, lengths)):
            cache.add_request(course.PagedKvCache(blocks, table, length), slot)
        batch.append(cache)
    mx.eval([(c.slots[0].layer.keys, c.slots[0].layer.values) for c in batch])
    return batch


def decode_step(model, batch: list) -> float:
    """Seconds of one decode forward of every row (token 0 at its offset), its
    logits evaluated; each row's offsets move on by one."""
    offsets = batch[0].offset
    tokens = mx.zeros((len(offsets), 1), mx.int32)
    began = time.perf_counter()
    mx.eval(model(tokens, offsets, batch))
    return time.perf_counter() - began


@contextmanager
def padded():
    """Paged attention as it was: every row gathered to the longest row's length
    (TinyKvCache.attend_staged over fetch_staged), not grouped by length."""
    cls = course.PagedBatchingKvCache
    grouped = cls.attend_staged
    cls.attend_staged = course.TinyKvCache.attend_staged
    try:
        yield
    finally:
        cls.attend_staged = grouped


@contextmanager
def blas_threads(count: int):
    """OpenBLAS on `count` threads inside (fast_blas runs it on one)."""
    previous = fast_blas.set_threads(count)
    try:
        yield
    finally:
        if previous is not None:
            fast_blas.set_threads(previous)
