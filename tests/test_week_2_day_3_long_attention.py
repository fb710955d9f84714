"""Week 2 Day 3: the CPU fast paths, fast_exp and cpu_attention.

References: NumPy in float64 (np.exp; softmax attention written out with each query
head's key/value head repeated), and mx.fast.scaled_dot_product_attention, computed
independently of the reference. Sizes are unusual on purpose (head dims 8 to 80,
3 and 5 query heads per key/value head, batches of rows at different offsets), the
contexts long enough to cut the work into many blocks, and SCORE_BLOCK is made tiny
to cut small problems as a long context would be.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

from .helpers import assert_within, numpy_attention
from .solution import tiny

# Float32 attention outputs (values ~N(0, 1)) against float64. The keys are scaled
# up, so scores reach ~15 and float32 rounds them by ~1e-6: mx.fast's attention and
# the hand-written one are off by as much as cpu_attention (measured: 4e-5 at 4,000
# keys, all three).
ATTENTION_ATOL = {mx.float32: 1e-4, mx.bfloat16: 3e-2}
# fast_exp against float64: most of the error is rounding x / ln2 and n ln2 in
# float32, so it grows with |x| (mx.exp's own: 3.8e-6 at |x| = 88).
EXP_RTOL_AT_0 = 3e-7
EXP_RTOL_PER_UNIT = 6e-8
SMALLEST_NORMAL = 2.0**-126


def kernels():
    return tiny.cpu_kernels


def inputs(B, H_q, H, L, S, D, dtype=mx.float32, seed=0):
    """q [B, H_q, L, D]; k and v [B, H, S, D] cut from longer arrays, as a cache's
    keys and values are; k scaled up so that the softmax is far from uniform."""
    key = mx.random.key(seed)
    kq, kk, kv = mx.random.split(key, 3)
    q = mx.random.normal((B, H_q, L, D), key=kq)
    k = 3 * mx.random.normal((B, H, S + 5, D), key=kk)[:, :, :S]
    v = mx.random.normal((B, H, S + 5, D), key=kv)[:, :, :S]
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def row_mask(offsets: list[int], L: int, S: int) -> mx.array:
    """Additive [B, 1, L, S]: row b's query i sees keys 0 .. offsets[b] + i (built
    here: batch_causal_mask is Day 5's)."""
    query = np.array(offsets)[:, None, None] + np.arange(L)[None, :, None]
    visible = np.arange(S)[None, None, :] <= query
    return mx.array(np.where(visible, 0.0, -np.inf).astype(np.float32))[:, None]


# ---- fast_exp -----------------------------------------------------------------


@pytest.mark.task(1)
def test_fast_exp_matches_numpy_over_the_float32_range():
    x = mx.concatenate(
        [
            mx.linspace(-87.3, 88.3, 400_001),
            mx.linspace(-1, 1, 100_001),
            mx.array([0.0, -0.0, 1e-30, -1e-30, 0.5 * math.log(2), math.log(2)]),
        ]
    )
    actual = np.array(tiny.fast_exp(x)).astype(np.float64)
    expected = np.exp(np.array(x).astype(np.float64))
    error = np.abs(actual - expected) / expected
    allowed = EXP_RTOL_AT_0 + EXP_RTOL_PER_UNIT * np.abs(np.array(x))
    worst = np.argmax(error / allowed)
    assert np.all(error <= allowed), (
        f"fast_exp({np.array(x)[worst]}) = {actual[worst]}, expected "
        f"{expected[worst]}: relative error {error[worst]:.2e}"
    )


@pytest.mark.task(1)
def test_fast_exp_underflows_to_zero_and_overflows_to_inf():
    """-inf (a mask's) is exactly 0; below the normal range at most the smallest
    normal float away, never negative; far above it inf; never NaN."""
    x = mx.array([-mx.inf, -1e30, -1000.0, -100.0, -88.5, -88.0, -87.5, 88.5, 1e4])
    actual = np.array(tiny.fast_exp(x))
    assert not np.isnan(actual).any()
    assert actual[0] == 0.0 and actual[1] == 0.0 and actual[2] == 0.0
    with np.errstate(over="ignore"):
        expected = np.exp(np.array(x).astype(np.float64))
    tiny_results = slice(0, 7)
    assert np.all(actual[tiny_results] >= 0)
    assert np.all(
        np.abs(actual[tiny_results] - expected[tiny_results]) <= SMALLEST_NORMAL
    )
    assert np.isinf(actual[-1]) and actual[-1] > 0
    assert np.isinf(tiny.fast_exp(mx.array([mx.inf])).item())


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=["f16", "bf16"])
def test_fast_exp_takes_half_precision_and_returns_float32(dtype):
    x = (mx.random.normal((7, 33), key=mx.random.key(1)) * 4).astype(dtype)
    actual = tiny.fast_exp(x)
    assert actual.dtype == mx.float32 and actual.shape == (7, 33)
    expected = np.exp(np.array(x.astype(mx.float32)).astype(np.float64))
    assert_within(actual, expected, 0.0, "fast_exp", rtol=2e-6)


@pytest.mark.task(1)
def test_fast_exp_keeps_any_shape():
    for shape in [(), (1,), (3, 1, 5), (2, 3, 4, 5)]:
        x = mx.random.uniform(-20, 20, shape, key=mx.random.key(len(shape)))
        actual = tiny.fast_exp(x)
        assert actual.shape == shape
        assert_within(actual, np.exp(np.array(x).astype(np.float64)), 0.0, rtol=3e-6)


@pytest.mark.task(1)
def test_softmax_numerators_subtract_each_columns_max():
    scores = mx.random.normal((2, 300, 7), key=mx.random.key(2)) * 10
    scores[0, 5:, 3] = -mx.inf  # a masked stretch of one column
    row_max = mx.max(scores, axis=-2, keepdims=True)
    actual = kernels().softmax_numerators(scores, row_max)
    expected = np.exp(np.array(scores - row_max).astype(np.float64))
    assert_within(actual, expected, 1e-7, "softmax_numerators", rtol=2e-6)
    assert np.array(actual)[0, 5:, 3].max() == 0.0


@pytest.mark.task(1)
def test_shape_limited_compile_keeps_few_shapes_and_stays_correct():
    compiled = kernels().ShapeLimitedCompile(lambda x: 2 * x + 1, limit=4)
    for n in range(1, 12):
        x = mx.arange(n, dtype=mx.float32)
        assert mx.array_equal(compiled(x), 2 * x + 1)
        assert len(compiled.shapes) <= 4
    assert mx.array_equal(compiled(mx.ones((3, 2))), mx.full((3, 2), 3.0))


# ---- cpu_attention -------------------------------------------------------------


@pytest.mark.task(2)
@pytest.mark.parametrize(
    "B, H_q, H, L, S, D",
    [
        (1, 9, 3, 128, 2128, 64),  # the embedded model: a chunk at position 2,000
        (1, 9, 3, 128, 4000, 64),  # one at 3,872, in several blocks per head
        (2, 10, 2, 37, 301, 24),  # 5 query heads per key/value head, two rows
        (1, 4, 4, 333, 333, 16),  # a whole prompt, longer than QUERY_BLOCK
        (1, 6, 2, 300, 1500, 80),  # a long chunk after cached keys
        (3, 6, 3, 1, 777, 8),  # decode rows
        (1, 9, 3, 5, 180, 64),  # a decode token and 4 drafts: attend_few
        (1, 9, 3, 5, 405, 64),  # the same at a longer context: attend_block
        (2, 6, 2, 3, 40, 16),  # two rows of 3 queries
    ],
)
def test_cpu_attention_causal_matches_numpy(B, H_q, H, L, S, D):
    q, k, v = inputs(B, H_q, H, L, S, D)
    scale = D**-0.5
    actual = tiny.cpu_attention(q, k, v, scale, "causal" if L > 1 else None)
    expected = numpy_attention(q, k, v, scale, "causal" if L > 1 else None)
    assert_within(actual, expected, ATTENTION_ATOL[mx.float32], "cpu_attention")


@pytest.mark.task(2)
def test_cpu_attention_matches_mx_fast():
    q, k, v = inputs(2, 9, 3, 70, 1200, 32, seed=3)
    for mask in ("causal", None, row_mask([1130, 500], 70, 1200)):
        actual = tiny.cpu_attention(q, k, v, 0.2, mask)
        expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
        assert_within(actual, expected, ATTENTION_ATOL[mx.float32], f"mask {mask}")


@pytest.mark.task(2)
@pytest.mark.parametrize("L", [1, 5, 40])
def test_cpu_attention_with_one_offset_per_row(L):
    """A batch cache's mask: each row's queries at their own positions; an array
    mask [B, 1, L, S] and a boolean one broadcast over heads and rows."""
    S = 900
    q, k, v = inputs(4, 6, 2, L, S, 32, seed=L)
    additive = row_mask([S - L, 17, 1, 450], L, S)
    for mask in (additive, additive == 0):
        actual = tiny.cpu_attention(q, k, v, 0.15, mask)
        expected = numpy_attention(q, k, v, 0.15, mask)
        assert_within(actual, expected, ATTENTION_ATOL[mx.float32], str(mask.dtype))
    boolean = mx.random.uniform(shape=(L, S), key=mx.random.key(9)) < 0.4
    boolean[:, 0] = True  # every query sees a key
    actual = tiny.cpu_attention(q, k, v, 0.15, boolean)
    expected = numpy_attention(q, k, v, 0.15, boolean)
    assert_within(actual, expected, ATTENTION_ATOL[mx.float32], "bool [L, S]")


@pytest.mark.task(2)
@pytest.mark.parametrize("score_block", [1, 700, 5000])
def test_cpu_attention_in_tiny_blocks(monkeypatch, score_block):
    """Blocks of any size give the same result: with SCORE_BLOCK tiny, a small
    problem is cut as a long context is (down to one query a block)."""
    monkeypatch.setattr(kernels(), "SCORE_BLOCK", score_block)
    q, k, v = inputs(2, 6, 3, 21, 150, 16, seed=4)
    for mask in ("causal", row_mask([129, 40], 21, 150), None):
        actual = tiny.cpu_attention(q, k, v, 0.25, mask)
        expected = numpy_attention(q, k, v, 0.25, mask)
        assert_within(actual, expected, ATTENTION_ATOL[mx.float32], f"mask {mask}")


@pytest.mark.task(2)
@pytest.mark.parametrize("few_scores", [0, 1 << 30], ids=["blocks", "few"])
@pytest.mark.parametrize("L", [1, 2, 6])
def test_cpu_attention_of_few_queries_either_way(monkeypatch, few_scores, L):
    """A decode step's attention (L = 1), or a decode token's with its drafts, by
    attend_block or attend_few (FEW_SCORES 0 or huge), equal to NumPy under every
    mask such a step gets, in both dtypes."""
    monkeypatch.setattr(kernels(), "FEW_SCORES", few_scores)
    q, k, v = inputs(3, 10, 2, L, 130, 24, seed=7 + L)
    additive = row_mask([130 - L, 3, 60], L, 130)
    for mask in (None, "causal", additive, additive == 0):
        actual = tiny.cpu_attention(q, k, v, 0.3, mask)
        expected = numpy_attention(q, k, v, 0.3, mask)
        assert_within(actual, expected, ATTENTION_ATOL[mx.float32], f"mask {mask}")
    q, k, v = inputs(2, 6, 3, 1, 40, 16, dtype=mx.bfloat16, seed=8)
    actual = tiny.cpu_attention(q, k, v, 0.25, None)
    assert actual.dtype == mx.bfloat16
    expected = numpy_attention(q, k, v, 0.25, None)
    assert_within(actual, expected, ATTENTION_ATOL[mx.bfloat16], "bfloat16")


@pytest.mark.task(2)
def test_cpu_attention_bfloat16_returns_bfloat16():
    q, k, v = inputs(1, 6, 2, 50, 600, 32, dtype=mx.bfloat16, seed=5)
    actual = tiny.cpu_attention(q, k, v, 32**-0.5, "causal")
    assert actual.dtype == mx.bfloat16
    expected = numpy_attention(q, k, v, 32**-0.5, "causal")
    assert_within(actual, expected, ATTENTION_ATOL[mx.bfloat16], "bfloat16")


@pytest.mark.task(2)
def test_cpu_attention_refuses_an_unknown_mask_name():
    q, k, v = inputs(1, 2, 1, 3, 3, 8)
    with pytest.raises(ValueError, match="causal"):
        tiny.cpu_attention(q, k, v, 1.0, "sliding")


@pytest.mark.task(3)
@pytest.mark.parametrize("name", ["swiglu_fast_exp", "swiglu"])
def test_swiglu_matches_silu_times_up(name):
    """The fast path's swiglu (silu from fast_exp, and swiglu, which picks it on the
    CPU): gate's dtype kept; extreme gates give their limits (0 far below, the gate
    itself far above), never NaN."""
    swiglu = getattr(tiny.qwen2_ops, name)
    gate = mx.concatenate(
        [mx.random.normal((3, 200), key=mx.random.key(6)) * 6, mx.full((3, 4), 0.0)],
        axis=1,
    )
    gate[:, -4:] = mx.array([-1e4, -100.0, 100.0, 1e4])
    up = mx.random.normal(gate.shape, key=mx.random.key(7))
    g = np.array(gate).astype(np.float64)
    with np.errstate(over="ignore"):
        expected = g / (1 + np.exp(-g)) * np.array(up)
    actual = swiglu(gate, up)
    assert actual.dtype == mx.float32 and not np.isnan(np.array(actual)).any()
    assert_within(actual, expected, 1e-5, "swiglu", rtol=1e-6)
    half = swiglu(gate.astype(mx.bfloat16), up.astype(mx.bfloat16))
    assert half.dtype == mx.bfloat16
