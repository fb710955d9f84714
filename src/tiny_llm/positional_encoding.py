"""Rotary positional encoding (RoPE): position becomes a rotation of feature pairs."""

import mlx.core as mx


class RoPE:
    """Rotate each pair of features (a, b) of a head by angle position * freq_i.

    freq_i = base^(-2i / dims) for i in 0 .. dims/2 - 1: the first pairs spin fast,
    the last ones slowly. Because q and k are rotated by their own positions, the
    score q . k depends only on the distance between them.

    traditional=True pairs neighbouring features (x[..., 0::2], x[..., 1::2]), as
    the original RoPE paper and llama.cpp do; False pairs feature i with feature
    i + dims/2 (the two halves), as Hugging Face Qwen2 and Llama models do.
    cos and sin are precomputed for positions 0 .. seq_len - 1.
    """

    def __init__(
        self, dims: int, seq_len: int, base: float = 10000, traditional: bool = False
    ):
        raise NotImplementedError(
            "Week 1 Day 2 Task 1: RoPE.__init__ (precompute cos/sin tables)"
        )

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """x: [B, L, H, D] -> [B, L, H, D], D == dims.

        offset: the absolute position of x[:, 0], an int shared by all rows or an
        mx.array [B] with one start position per row (rows of a batch that are at
        different points of their sequences).
        """
        raise NotImplementedError(
            "Week 1 Day 2 Task 1: RoPE.__call__ (rotate feature pairs)"
        )
