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
        # Week 1 Day 2 Task 1: RoPE.__init__ (precompute cos/sin tables)
        if dims % 2 != 0:
            raise ValueError(
                f"RoPE rotates pairs of features: dims {dims} must be even"
            )
        self.dims = dims
        self.seq_len = seq_len
        self.traditional = traditional
        freqs = base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        angles = mx.arange(seq_len, dtype=mx.float32)[:, None] * freqs[None, :]
        self.cos = mx.cos(angles)  # [seq_len, dims / 2]
        self.sin = mx.sin(angles)

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """x: [B, L, H, D] -> [B, L, H, D], D == dims.

        offset: the absolute position of x[:, 0], an int shared by all rows or an
        mx.array [B] with one start position per row (rows of a batch that are at
        different points of their sequences).
        """
        # Week 1 Day 2 Task 1: RoPE.__call__ (rotate feature pairs)
        _, length, _, dim = x.shape
        if isinstance(offset, int) and offset + length > self.seq_len:
            raise ValueError(
                f"positions up to {offset + length - 1} exceed RoPE's seq_len "
                f"{self.seq_len}: build RoPE with a larger seq_len"
            )
        positions = mx.array(offset).reshape(-1, 1) + mx.arange(length)  # [1 or B, L]
        cos = self.cos[positions][:, :, None, :]  # [1 or B, L, 1, D/2]: every head
        sin = self.sin[positions][:, :, None, :]
        if self.traditional:
            first, second = x[..., 0::2], x[..., 1::2]
        else:
            first, second = x[..., : dim // 2], x[..., dim // 2 :]
        rotated_first = first * cos - second * sin
        rotated_second = first * sin + second * cos
        if self.traditional:
            out = mx.stack([rotated_first, rotated_second], axis=-1).reshape(x.shape)
        else:
            out = mx.concatenate([rotated_first, rotated_second], axis=-1)
        return out.astype(x.dtype)
