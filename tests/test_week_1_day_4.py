"""Week 1 Day 4: RMSNorm and the SwiGLU MLP.

References: mx.fast.rms_norm, mlx.nn.RMSNorm, a float64 numpy formula, and mlx-lm's
Qwen2 MLP holding the same weights.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models import qwen2

from .helpers import assert_close
from .solution import tiny

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@pytest.mark.task(1)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim, eps", [(7, 1e-5), (96, 1e-6), (576, 1e-5)])
def test_rms_norm(dtype, dim, eps):
    x = mx.random.normal((3, 5, dim)).astype(dtype)
    weight = (1 + 0.3 * mx.random.normal((dim,))).astype(dtype)
    norm = tiny.RMSNorm(dim, weight, eps=eps)
    assert_close(norm(x), mx.fast.rms_norm(x, weight, eps), dtype)
    reference = nn.RMSNorm(dim, eps=eps)
    reference.weight = weight
    assert_close(norm(x), reference(x), dtype)


@pytest.mark.task(1)
def test_rms_norm_default_eps():
    x = 1e-3 * mx.random.normal((4, 16))
    weight = mx.random.normal((16,))
    actual = tiny.RMSNorm(16, weight)(x)
    assert_close(actual, mx.fast.rms_norm(x, weight, 1e-5), mx.float32)


@pytest.mark.task(1)
def test_rms_norm_float16_large_activations():
    # Squares of values in the hundreds overflow float16 (max 65504).
    x = (400 * mx.random.normal((2, 64))).astype(mx.float16)
    weight = mx.random.normal((64,)).astype(mx.float16)
    actual = tiny.RMSNorm(64, weight, eps=1e-6)(x)
    x64 = np.array(x).astype(np.float64)
    expected = x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + 1e-6)
    expected *= np.array(weight).astype(np.float64)
    assert actual.dtype == mx.float16
    assert np.isfinite(np.array(actual)).all()
    np.testing.assert_allclose(
        np.array(actual).astype(np.float64), expected, atol=1e-2, rtol=2e-3
    )


@pytest.mark.task(2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim, hidden_dim", [(24, 40), (96, 160), (64, 7)])
def test_qwen2_mlp(dtype, dim, hidden_dim):
    reference = qwen2.MLP(dim, hidden_dim)
    reference.set_dtype(dtype)
    mlp = tiny.Qwen2MLP(
        dim,
        hidden_dim,
        reference.gate_proj.weight,
        reference.up_proj.weight,
        reference.down_proj.weight,
    )
    x = mx.random.normal((2, 5, dim)).astype(dtype)
    assert_close(mlp(x), reference(x), dtype, scale=2)
