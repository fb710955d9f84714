"""Assertions the week-1 tests share."""

import mlx.core as mx
import numpy as np

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 2e-2}


def assert_close(
    actual: mx.array,
    expected: mx.array,
    dtype: mx.Dtype,
    scale: float = 1.0,
    tolerance: dict = TOLERANCE,
) -> None:
    """Same shape and dtype, and values within tolerance[dtype] * scale (abs and rel)."""
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    tol = tolerance[dtype] * scale
    np.testing.assert_allclose(
        np.array(actual.astype(mx.float32)),
        np.array(expected.astype(mx.float32)),
        atol=tol,
        rtol=tol,
    )
