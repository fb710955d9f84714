"""One paged decode step of the model at chosen row lengths: the pool's blocks hold
random keys and values (a decode step's cost does not depend on what they are), so
a 6,000-token row needs no 6,000-token prefill.

    batch = paged_batch(model, [6000, 200, 200, 200])
    seconds = decode_step(model, batch)           # one forward, evaluated
    with padded():                                # the baseline: every row read
        seconds = decode_step(model, batch)       # to the longest row's length
    with blas_threads(1):                         # OpenBLAS on 1 thread
        seconds = decode_step(model, batch)
"""

import os
import time
from contextlib import contextmanager

import mlx.core as mx

from tiny_llm_base import fast_blas
from scripts.bench.benchlib.course import course
from scripts.bench.benchlib.harness import interleaved
from scripts.bench.benchlib.goals import at_most

BLOCK_SIZE = 16
ROOM = 64  # positions past each row's length: the steps a benchmark may time
SHORT_ROWS = [200, 200, 200]
STEP_RUNS = 7  # the paged step's interleaved runs, the least of them kept


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
    """OpenBLAS on `count` threads inside (fast_blas leaves it a thread per core)."""
    previous = fast_blas.set_threads(count)
    try:
        yield
    finally:
        if previous is not None:
            fast_blas.set_threads(previous)


def step_part(bench, model, long_row: int, repeats: int) -> tuple[dict, list]:
    """bench-engine's paged step: its table and goal, one `long_row` row with
    SHORT_ROWS against it alone, grouped and padded, interleaved (the least of at
    least STEP_RUNS runs each). The floor beside it: the step's cost outside
    the long row's attention grows with the batch too (the projections and the
    logits of 4 rows against 1), measured as 4 short rows against 1 short row and
    added to the long row alone. Where OpenBLAS runs the matmuls, the same steps on
    the other thread count (one thread, or a thread per core where OpenBLAS was
    given one) as a baseline."""
    batches = {
        "mixed": paged_batch(model, [long_row, *SHORT_ROWS]),
        "alone": paged_batch(model, [long_row]),
        "4 short": paged_batch(model, [SHORT_ROWS[0]] * 4),
        "1 short": paged_batch(model, [SHORT_ROWS[0]]),
    }
    threads = fast_blas.STATUS.threads
    other = (os.cpu_count() or 1) if threads == 1 else 1
    threaded = f"grouped, {other} BLAS threads"

    def padded_step(batch):
        with padded():
            return decode_step(model, batch)

    def on_other_threads_step(batch):
        with blas_threads(other):
            return decode_step(model, batch)

    jobs = {
        ("grouped", k): lambda b=b: decode_step(model, b) for k, b in batches.items()
    }
    jobs["padded", "mixed"] = lambda: padded_step(batches["mixed"])
    ways = ["grouped", "padded"]
    if threads is not None and threads != other:
        ways.append(threaded)
        for k, b in batches.items():
            jobs[threaded, k] = lambda b=b: on_other_threads_step(b)
    for job in jobs.values():
        job()
    runs = interleaved(jobs, max(repeats, STEP_RUNS))
    ms = {k: 1e3 * min(v) for k, v in runs.items()}  # a busy machine only adds
    ms["padded", "alone"] = ms["grouped", "alone"]  # one row: the same gather
    ratio = {way: ms[way, "mixed"] / ms[way, "alone"] for way in ways}
    rows = {way: (ms[way, "alone"], ms[way, "mixed"], ratio[way]) for way in ways}
    extra, floor = {}, {}
    for way in ways:
        if (way, "4 short") in ms:
            extra[way] = ms[way, "4 short"] - ms[way, "1 short"]
            floor[way] = (ms[way, "alone"] + extra[way]) / ms[way, "alone"]
            label = "" if way == "grouped" else f", {other} BLAS threads"
            rows[f"floor{label}: alone + ({SHORT_ROWS[0]} x4 - x1)"] = (
                ms[way, "alone"],
                ms[way, "alone"] + extra[way],
                floor[way],
            )
    columns = {
        "attention": lambda way, _: way,
        "alone": lambda _, r: f"{r[0]:.1f}",
        "with 3 short": lambda _, r: f"{r[1]:.1f}",
        "ratio": lambda _, r: f"{r[2]:.2f}x",
    }
    title = f"paged decode step, ms: {long_row} tokens alone, and with three {SHORT_ROWS[0]}-token rows"
    bench.table(title, columns, rows)
    why = (
        f"{ms['grouped', 'mixed']:.0f} ms against {ms['grouped', 'alone']:.0f} ms "
        f"(padded: {ratio['padded']:.2f}x); the floor {floor['grouped']:.2f}x: 4 "
        f"short rows cost {extra['grouped']:.0f} ms more than 1 outside attention"
    )
    if threaded in ratio:
        why += (
            f"; on {other} BLAS threads {ratio[threaded]:.2f}x, floor "
            f"{floor[threaded]:.2f}x ({extra[threaded]:.0f} ms)"
        )
    goal = at_most(
        f"paged step with 3 short rows / the {long_row}-token row alone",
        ratio["grouped"],
        1.25,
        why,
    )
    record = dict(
        step_ms={" ".join(k): v for k, v in ms.items()}, ratio=ratio, floor=floor
    )
    return record, [goal]
