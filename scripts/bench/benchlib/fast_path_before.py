"""The fast path as it was before cpu_attention and fast_exp, for bench-attention's
side-by-side runs: the "before" path swaps it into the model, "after" is the course
package as it is now. Also the caches those runs fill and rewind.

Imports MLX: a script imports tiny_llm_base first.
"""

import time
from collections.abc import Callable
from contextlib import contextmanager

import mlx.core as mx

from tiny_llm_base.device import gpu_paths

from .course import course
from .harness import interleaved

CHUNK = 128  # mx.fast's blocks of queries on a CPU, and the chunk the bench prefills


def previous_fast_attention(q, k, v, scale, mask):
    """The reference's fast_attention before cpu_attention: mx.fast's attention; on a
    CPU a causal chunk longer than 128 queries in blocks of 128 queries, each block
    against the keys it can see."""
    L, S = q.shape[2], k.shape[2]
    if gpu_paths() or not (isinstance(mask, str) and L > CHUNK):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    blocks = []
    for start in range(0, L, CHUNK):
        end = min(start + CHUNK, L)
        visible = S - L + end
        blocks.append(
            mx.fast.scaled_dot_product_attention(
                q[:, :, start:end],
                k[:, :, :visible],
                v[:, :, :visible],
                scale=scale,
                mask="causal",
            )
        )
    return mx.concatenate(blocks, axis=2)


@mx.compile
def previous_swiglu(gate, up):
    """swiglu before: silu with mx.sigmoid, compiled."""
    return course.silu(gate) * up


@contextmanager
def before():
    """Run the fast path as it was: course.qwen2_week2's fast_attention and swiglu
    (the names its blocks call) swapped for the previous versions."""
    module = course.qwen2_week2
    saved = module.fast_attention, module.swiglu
    module.fast_attention, module.swiglu = previous_fast_attention, previous_swiglu
    try:
        yield
    finally:
        module.fast_attention, module.swiglu = saved


@contextmanager
def after():
    yield


PATHS = {"before": before, "after": after}


def before_and_after(step: Callable[[], object], reset, repeats: int) -> dict:
    """{path: ms of step() on it}, interleaved `repeats` rounds after one that warms
    up (and grows the caches); reset() after every step forgets what it wrote."""

    def on(path) -> float:
        with path():
            start = time.perf_counter()
            mx.eval(step())
            elapsed = (time.perf_counter() - start) * 1e3
        reset()
        return elapsed

    runs = interleaved(
        {name: lambda p=path: on(p) for name, path in PATHS.items()}, repeats + 1
    )
    return {name: times[1:] for name, times in runs.items()}


def random_layer_cache(model, position: int):
    """One layer's cache holding `position` random keys and values."""
    layer_cache = course.TinyKvFullCache()
    if position:
        attention = model.layers[0].attention
        shape = (1, attention.num_kv_heads, position, attention.head_dim)
        layer_cache.update_and_fetch(mx.random.normal(shape), mx.random.normal(shape))
        mx.eval(layer_cache.keys, layer_cache.values)
    return layer_cache


def filled_cache(model, position: int) -> list:
    """A cache per layer holding `position` random keys and values."""
    return [random_layer_cache(model, position) for _ in range(model.num_layers)]


def rewind(cache: list, offset: int) -> None:
    """Forget what a measured step wrote after `offset` (it is written again)."""
    for layer_cache in cache:
        layer_cache.offset = offset
