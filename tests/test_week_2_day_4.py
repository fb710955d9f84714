"""Week 2 Day 4: flash attention, checked against mx.fast and a numpy softmax."""

import math

import mlx.core as mx
import numpy as np
import pytest

from .helpers import assert_within, numpy_attention, numpy_chunk_mask, random_qkv
from .solution import tiny

# Against float64 numpy on the same (rounded) inputs, flash attention only rounds its
# float32 result to the input dtype. mx.fast also rounds intermediates in that dtype.
TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}
FLOAT32 = TOLERANCE[mx.float32]
FAST_TOLERANCE = {mx.float32: 1e-5, mx.float16: 1e-2, mx.bfloat16: 6e-2}

# (batch, query heads, kv heads, L, S, head dim): L != S, S not a multiple of the
# tile, L = 1, several query tiles, grouped heads 6/2, 9/3 and 4/1.
SHAPES = [
    (1, 2, 2, 7, 100, 32),
    (2, 6, 2, 1, 130, 64),
    (1, 9, 3, 70, 70, 80),
    (2, 4, 1, 33, 257, 64),
    (1, 6, 2, 129, 200, 32),
]


def numpy_random_mask(shape, rng):
    """Additive mask with ~30% -inf entries; key 0 is always kept, so no row is empty."""
    mask = np.where(rng.random(shape) < 0.3, -np.inf, rng.normal(size=shape))
    mask[..., 0] = 0.0
    return mask


def assert_close(actual, expected, tolerance):
    assert_within(actual, expected, tolerance, rtol=tolerance)


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_no_mask_matches_mx_fast(shape, dtype):
    B, H_q, _, L, _, D = shape
    query, key, value = random_qkv(*shape, dtype)
    scale = 1.0 / math.sqrt(D)
    output = tiny.flash_attention(query, key, value)
    assert output.shape == (B, H_q, L, D)
    assert output.dtype == dtype
    expected = mx.fast.scaled_dot_product_attention(query, key, value, scale=scale)
    assert_close(output, expected.astype(mx.float32), FAST_TOLERANCE[dtype])
    assert_close(output, numpy_attention(query, key, value, scale), TOLERANCE[dtype])


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_causal_chunk_mask(shape, dtype):
    *_, L, S, D = shape
    query, key, value = random_qkv(*shape, dtype)
    scale = 1.0 / math.sqrt(D)
    output = tiny.flash_attention(query, key, value, mask="causal")
    expected = mx.fast.scaled_dot_product_attention(
        query, key, value, scale=scale, mask="causal"
    )
    assert_close(output, expected.astype(mx.float32), FAST_TOLERANCE[dtype])
    expected = numpy_attention(query, key, value, scale, numpy_chunk_mask(L, S))
    assert_close(output, expected, TOLERANCE[dtype])


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("mask_shape", ["L S", "B 1 L S", "B H_q L S"])
def test_array_mask(mask_shape, dtype):
    B, H_q, H, L, S, D = 2, 6, 2, 45, 150, 64
    sizes = {"B": B, "H_q": H_q, "L": L, "S": S, "1": 1}
    rng = np.random.default_rng(1)
    shape = tuple(sizes[name] for name in mask_shape.split())
    mask = mx.array(numpy_random_mask(shape, rng)).astype(dtype)
    query, key, value = random_qkv(B, H_q, H, L, S, D, dtype)
    scale = 0.3
    output = tiny.flash_attention(query, key, value, scale=scale, mask=mask)
    expected = mx.fast.scaled_dot_product_attention(
        query, key, value, scale=scale, mask=mask
    )
    assert_close(output, expected.astype(mx.float32), FAST_TOLERANCE[dtype])
    expected = numpy_attention(
        query, key, value, scale, np.array(mask.astype(mx.float32), np.float64)
    )
    assert_close(output, expected, TOLERANCE[dtype])


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "query_tile, key_tile", [(1, 97), (25, 1), (16, 48), (64, 64), (512, 7)]
)
@pytest.mark.parametrize("mask", [None, "causal"])
def test_tile_sizes_leave_output_unchanged(query_tile, key_tile, mask):
    B, H_q, H, L, S, D = 1, 4, 2, 50, 97, 32
    query, key, value = random_qkv(B, H_q, H, L, S, D, mx.float32)
    scale = 1.0 / math.sqrt(D)
    output = tiny.flash_attention(
        query, key, value, mask=mask, query_tile=query_tile, key_tile=key_tile
    )
    chunk = numpy_chunk_mask(L, S) if mask == "causal" else None
    assert_close(output, numpy_attention(query, key, value, scale, chunk), FLOAT32)


@pytest.mark.task(2)
def test_causal_ordinary_when_L_equals_S():
    B, H_q, H, L, S, D = 1, 3, 3, 130, 130, 64
    query, key, value = random_qkv(B, H_q, H, L, S, D, mx.float32)
    output = tiny.flash_attention(query, key, value, mask="causal", key_tile=16)
    expected = numpy_attention(query, key, value, 1 / 8, numpy_chunk_mask(L, S))
    assert_close(output, expected, FLOAT32)
    # Query 0 sees only key 0: its output is value 0.
    assert_close(output[:, :, 0], np.array(value[:, :, 0]), FLOAT32)


@pytest.mark.task(1)
def test_masked_first_tile_does_not_poison_rows():
    """A row whose first key tile is all -inf must not turn into NaN."""
    B, H_q, H, L, S, D = 1, 2, 1, 5, 40, 32
    query, key, value = random_qkv(B, H_q, H, L, S, D, mx.float32)
    mask = np.zeros((L, S))
    mask[:, :16] = -np.inf
    output = tiny.flash_attention(
        query, key, value, mask=mx.array(mask, dtype=mx.float32), key_tile=8
    )
    assert not np.isnan(np.array(output)).any()
    expected = numpy_attention(query, key, value, 1 / math.sqrt(D), mask)
    assert_close(output, expected, FLOAT32)


@pytest.mark.task(1)
def test_fully_masked_row_is_zero_not_nan():
    B, H_q, H, L, S, D = 1, 2, 2, 4, 70, 32
    query, key, value = random_qkv(B, H_q, H, L, S, D, mx.float32)
    mask = np.zeros((L, S))
    mask[2] = -np.inf
    output = np.array(
        tiny.flash_attention(query, key, value, mask=mx.array(mask, dtype=mx.float32))
    )
    assert not np.isnan(output).any()
    np.testing.assert_array_equal(output[:, :, 2], 0.0)
    keep = mx.array([0, 1, 3])
    expected = numpy_attention(query[:, :, keep], key, value, 1 / math.sqrt(D))
    np.testing.assert_allclose(output[:, :, [0, 1, 3]], expected, atol=FLOAT32)


@pytest.mark.task(1)
def test_large_scores_do_not_overflow():
    """Scores around 1e4 overflow exp() unless every tile subtracts a running max."""
    B, H_q, H, L, S, D = 1, 2, 2, 9, 150, 64
    query, key, value = random_qkv(B, H_q, H, L, S, D, mx.float32)
    key = key + mx.arange(S).reshape(1, 1, S, 1) / S  # the max grows tile after tile
    output = tiny.flash_attention(query * 100, key, value, scale=1.0)
    assert np.isfinite(np.array(output)).all()
    expected = numpy_attention(query * 100, key, value, 1.0)
    np.testing.assert_allclose(np.array(output), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.task(1)
def test_query_heads_must_be_a_multiple_of_kv_heads():
    query, key, value = random_qkv(1, 5, 2, 3, 10, 32, mx.float32)
    with pytest.raises(ValueError):
        tiny.flash_attention(query, key, value)


@pytest.mark.task(1)
@pytest.mark.parametrize("mask", ["upper", mx.ones((3, 10), dtype=mx.bool_)])
def test_unsupported_masks_are_refused(mask):
    query, key, value = random_qkv(1, 2, 2, 3, 10, 32, mx.float32)
    with pytest.raises(ValueError):
        tiny.flash_attention(query, key, value, mask=mask)


def naive_attention(query, key, value):
    """The [L, S] scores materialized: what flash attention avoids."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    scores = (query * scale) @ key.swapaxes(-1, -2)
    return mx.softmax(scores, axis=-1) @ value


def extra_peak_bytes(attention, L, S, heads=2, D=64):
    """Peak memory above the inputs while `attention` runs on [1, heads, ., D] inputs."""
    query, key, value = random_qkv(1, heads, heads, L, S, D, mx.float32)
    mx.eval(query, key, value)
    inputs = mx.get_active_memory()
    mx.reset_peak_memory()
    mx.eval(attention(query, key, value))
    return mx.get_peak_memory() - inputs


@pytest.mark.task(1)
def test_peak_memory_does_not_grow_with_L_times_S():
    L, heads, small, large = 256, 2, 1024, 8192
    scores_growth = L * (large - small) * heads * 4  # float32 [L, S] scores per head
    flash = [
        extra_peak_bytes(tiny.flash_attention, L, S, heads) for S in (small, large)
    ]
    naive = [extra_peak_bytes(naive_attention, L, S, heads) for S in (small, large)]
    # The measurement can fail: the naive version's peak grows with its scores.
    assert naive[1] - naive[0] >= 0.9 * scores_growth
    assert flash[1] - flash[0] < scores_growth / 2
