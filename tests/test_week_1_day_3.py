"""Week 1 Day 3: the chunk causal mask and grouped-query attention.

References: masks built with numpy loops in this file, and
mx.fast.scaled_dot_product_attention, which supports grouped heads natively.
"""

import mlx.core as mx
import numpy as np
import pytest

from .helpers import assert_close, numpy_chunk_mask, random_qkv
from .solution import tiny

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@pytest.mark.task(1)
@pytest.mark.parametrize("L, S", [(1, 1), (4, 4), (3, 7), (1, 9), (5, 12)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_causal_mask(L, S, dtype):
    mask = tiny.causal_mask(L, S, dtype)
    assert mask.shape == (L, S)
    assert mask.dtype == dtype
    np.testing.assert_array_equal(
        np.array(mask.astype(mx.float32)), numpy_chunk_mask(L, S)
    )


@pytest.mark.task(1)
def test_causal_mask_square_is_lower_triangular():
    mask = np.array(tiny.causal_mask(6, 6, mx.float32))
    np.testing.assert_array_equal(mask == 0, np.tril(np.ones((6, 6), dtype=bool)))


@pytest.mark.task(1)
def test_causal_mask_single_query_masks_nothing():
    np.testing.assert_array_equal(np.array(tiny.causal_mask(1, 10, mx.float32)), 0)


# (batch, query heads, key/value heads, L, S, head dim)
SHAPES = [
    (1, 6, 2, 5, 5, 16),
    (2, 9, 3, 7, 7, 8),
    (3, 4, 4, 4, 6, 12),
    (1, 8, 1, 3, 3, 32),
]


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_attention_no_mask(dtype, shape):
    q, k, v = random_qkv(*shape, dtype)
    scale = shape[-1] ** -0.5
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    assert_close(tiny.scaled_dot_product_attention_grouped(q, k, v), expected, dtype)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] == s[4]])
def test_grouped_attention_causal_square(dtype, shape):
    q, k, v = random_qkv(*shape, dtype)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal")
    actual = tiny.scaled_dot_product_attention_grouped(
        q, k, v, scale=0.3, mask="causal"
    )
    assert_close(actual, expected, dtype)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L, S", [(1, 9), (3, 8), (5, 6)])
def test_grouped_attention_causal_chunk(dtype, L, S):
    q, k, v = random_qkv(2, 6, 3, L, S, 16, dtype)
    mask = mx.array(numpy_chunk_mask(L, S)).astype(dtype)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    actual = tiny.scaled_dot_product_attention_grouped(
        q, k, v, scale=0.25, mask="causal"
    )
    assert_close(actual, expected, dtype)


@pytest.mark.task(2)
def test_grouped_attention_causal_single_query_equals_no_mask():
    q, k, v = random_qkv(2, 6, 2, 1, 11, 8, mx.float32)
    unmasked = mx.fast.scaled_dot_product_attention(q, k, v, scale=8**-0.5)
    causal = tiny.scaled_dot_product_attention_grouped(q, k, v, mask="causal")
    assert_close(causal, unmasked, mx.float32)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", [(4, 7), (2, 1, 4, 7), (2, 6, 4, 7)])
def test_grouped_attention_array_mask(dtype, mask_shape):
    q, k, v = random_qkv(2, 6, 2, 4, 7, 16, dtype)
    mask = mx.random.normal(mask_shape).astype(dtype)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    actual = tiny.scaled_dot_product_attention_grouped(q, k, v, scale=0.25, mask=mask)
    assert_close(actual, expected, dtype)


@pytest.mark.task(2)
def test_grouped_attention_rejects_uneven_heads():
    q, k, v = random_qkv(1, 6, 4, 2, 2, 8, mx.float32)
    with pytest.raises(ValueError):
        tiny.scaled_dot_product_attention_grouped(q, k, v)
