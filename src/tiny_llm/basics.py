"""The three building blocks every later layer is made of: softmax, linear, SiLU."""

import mlx.core as mx


def softmax(x: mx.array, axis: int) -> mx.array:
    """exp(x) / sum(exp(x)) along `axis`.

    Subtracting the maximum first changes nothing mathematically but keeps `exp`
    from overflowing; the sum is done in float32 and the result has x's dtype.
    """
    raise NotImplementedError(
        "Week 1 Day 1 Task 1: softmax (subtract the max, exp, normalize)"
    )


def linear(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x: [..., I], w: [O, I], bias: [O] -> [..., O].

    Weights are stored one output row per neuron (the PyTorch / MLX layout), so the
    product is x @ w.T.
    """
    raise NotImplementedError("Week 1 Day 1 Task 1: linear (x @ w.T + bias)")


def silu(x: mx.array) -> mx.array:
    """x * sigmoid(x), elementwise (also called swish)."""
    raise NotImplementedError("Week 1 Day 1 Task 1: silu (x * sigmoid(x))")
