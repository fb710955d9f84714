"""Week 1 Day 1: softmax, linear, silu, scaled dot-product attention, multi-head attention.

References: mlx.core/mlx.nn functions and mx.fast.scaled_dot_product_attention.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from .helpers import assert_close, random_qkv
from .solution import tiny

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(dtype, axis):
    x = mx.random.normal((5, 7, 11)).astype(dtype)
    assert_close(tiny.softmax(x, axis=axis), mx.softmax(x, axis=axis), dtype)


@pytest.mark.task(1)
def test_softmax_is_stable_for_large_inputs():
    x = mx.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -999.0]])
    expected = np.exp(np.array([[-2.0, -1.0, 0.0], [-1.0, -1.0, 0.0]]))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(np.array(tiny.softmax(x, axis=-1)), expected, rtol=1e-6)


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(dtype, with_bias):
    layer = nn.Linear(13, 6, bias=with_bias)
    layer.set_dtype(dtype)
    x = mx.random.normal((2, 3, 13)).astype(dtype)
    bias = layer.bias if with_bias else None
    assert_close(tiny.linear(x, layer.weight, bias), layer(x), dtype)


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu(dtype):
    x = (4 * mx.random.normal((4, 9))).astype(dtype)
    assert_close(tiny.silu(x), nn.silu(x), dtype)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 8), (2, 3, 5, 7, 16), (3, 2, 9, 9, 12)])
def test_attention_simple(dtype, shape):
    batch, heads, L, S, dim = shape
    q, k, v = random_qkv(batch, heads, heads, L, S, dim, dtype)
    scale = 1.0 / np.sqrt(dim)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    assert_close(tiny.scaled_dot_product_attention_simple(q, k, v), expected, dtype)


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_simple_with_scale_and_mask(dtype):
    q, k, v = random_qkv(2, 3, 3, 4, 6, 8, dtype)
    mask = mx.random.normal((2, 3, 4, 6)).astype(dtype)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.7, mask=mask)
    actual = tiny.scaled_dot_product_attention_simple(q, k, v, scale=0.7, mask=mask)
    assert_close(actual, expected, dtype)


@pytest.mark.task(2)
def test_attention_simple_with_leading_dims_only():
    q = mx.random.normal((5, 8))
    k = mx.random.normal((7, 8))
    v = mx.random.normal((7, 3))
    scores = np.array(q) @ np.array(k).T / np.sqrt(8)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    actual = tiny.scaled_dot_product_attention_simple(q, k, v)
    np.testing.assert_allclose(np.array(actual), weights @ np.array(v), atol=1e-5)


@pytest.mark.task(3)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_simple_multi_head_attention(dtype, with_mask):
    batch, length, source_length, hidden, heads = 2, 5, 7, 24, 3
    reference = nn.MultiHeadAttention(hidden, heads)
    reference.set_dtype(dtype)
    attention = tiny.SimpleMultiHeadAttention(
        hidden,
        heads,
        reference.query_proj.weight,
        reference.key_proj.weight,
        reference.value_proj.weight,
        reference.out_proj.weight,
    )
    query = mx.random.normal((batch, length, hidden)).astype(dtype)
    key = mx.random.normal((batch, source_length, hidden)).astype(dtype)
    value = mx.random.normal((batch, source_length, hidden)).astype(dtype)
    mask = (
        mx.random.normal((length, source_length)).astype(dtype) if with_mask else None
    )
    expected = reference(query, key, value, mask=mask)
    assert_close(attention(query, key, value, mask=mask), expected, dtype, scale=2)
