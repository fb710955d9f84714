"""RMSNorm: rescale each vector to unit root-mean-square, then by a learned weight."""

import mlx.core as mx


class RMSNorm:
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last axis.

    weight: [dim]. The mean of squares is taken in float32: in float16 the squares
    of activations in the hundreds already overflow. The output has x's dtype.
    """

    def __init__(self, dim: int, weight: mx.array, eps: float = 1e-5):
        # Week 1 Day 4 Task 1: RMSNorm.__init__ (keep weight and eps)
        self.dim = dim
        self.weight = weight.astype(mx.float32)
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        """x: [..., dim] -> [..., dim]."""
        # Week 1 Day 4 Task 1: RMSNorm (normalize in float32, scale by weight)
        x32 = x.astype(mx.float32)
        scale = mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + self.eps)
        return (x32 * scale * self.weight).astype(x.dtype)
