"""Week 1 Day 2: rotary positional encoding, checked against mx.fast.rope.

tiny's RoPE takes x as [B, L, H, D]; mx.fast.rope wants the sequence axis second to
last, so the reference sees x transposed to [B, H, L, D].
"""

import mlx.core as mx
import numpy as np
import pytest

from .helpers import assert_close
from .solution import tiny

pytestmark = pytest.mark.task(1)


def reference_rope(x, dims, base, traditional, offset):
    rotated = mx.fast.rope(
        x.swapaxes(1, 2),
        dims,
        traditional=traditional,
        base=base,
        scale=1.0,
        offset=offset,
    )
    return rotated.swapaxes(1, 2)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 37])
def test_rope_int_offset(dtype, traditional, offset):
    batch, length, heads, dims, base = 2, 9, 3, 18, 10000.0
    x = mx.random.normal((batch, length, heads, dims)).astype(dtype)
    rope = tiny.RoPE(dims, seq_len=64, base=base, traditional=traditional)
    expected = reference_rope(x, dims, base, traditional, offset)
    assert_close(rope(x, offset=offset), expected, dtype)


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_other_base_and_default_offset(traditional):
    x = mx.random.normal((1, 7, 2, 64))
    rope = tiny.RoPE(64, seq_len=7, base=1e6, traditional=traditional)
    assert_close(rope(x), reference_rope(x, 64, 1e6, traditional, 0), mx.float32)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_per_row_offsets(dtype, traditional):
    batch, length, heads, dims, base = 4, 5, 2, 16, 500.0
    x = mx.random.normal((batch, length, heads, dims)).astype(dtype)
    offsets = mx.array([0, 3, 11, 26])
    rope = tiny.RoPE(dims, seq_len=32, base=base, traditional=traditional)
    expected = reference_rope(x, dims, base, traditional, offsets)
    assert_close(rope(x, offset=offsets), expected, dtype)
    # Row by row with int offsets gives the same answer.
    for row in range(batch):
        actual = rope(x[row : row + 1], offset=int(offsets[row]))
        assert_close(actual, expected[row : row + 1], dtype)


def test_rope_single_token_decode_offsets():
    x = mx.random.normal((3, 1, 4, 8))
    offsets = mx.array([5, 0, 19])
    rope = tiny.RoPE(8, seq_len=20)
    assert_close(
        rope(x, offsets), reference_rope(x, 8, 10000.0, False, offsets), mx.float32
    )


def test_rope_scores_depend_only_on_distance():
    rope = tiny.RoPE(16, seq_len=64)
    q = mx.broadcast_to(mx.random.normal((1, 1, 1, 16)), (1, 40, 1, 16))
    k = mx.broadcast_to(mx.random.normal((1, 1, 1, 16)), (1, 40, 1, 16))
    q_rot, k_rot = rope(q)[0, :, 0], rope(k)[0, :, 0]
    scores = np.array(q_rot @ k_rot.T)
    # Same distance i - j, same score: the diagonals of the score matrix are constant.
    for distance in (-5, 0, 3, 17):
        diagonal = np.diagonal(scores, offset=-distance)
        np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-4)


def test_rope_rejects_positions_past_seq_len():
    rope = tiny.RoPE(8, seq_len=10)
    with pytest.raises(ValueError, match="seq_len"):
        rope(mx.zeros((1, 4, 1, 8)), offset=7)
