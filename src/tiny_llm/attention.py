"""Scaled dot-product attention, multi-head and grouped, and the chunk causal mask."""

import math

import mlx.core as mx

from .basics import linear, softmax


def scaled_dot_product_attention_simple(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | None = None,
) -> mx.array:
    """softmax(query @ key.T * scale + mask) @ value.

    query: [..., L, D], key and value: [..., S, D] -> [..., L, D].
    scale defaults to 1 / sqrt(D): it keeps the scores' variance near 1 so the
    softmax does not saturate. mask is additive (0 keeps a score, -inf drops it) and
    broadcasts to [..., L, S].
    """
    raise NotImplementedError(
        "Week 1 Day 1 Task 2: scaled_dot_product_attention_simple (scores, mask, "
        "softmax, @ value)"
    )


class SimpleMultiHeadAttention:
    """Attention run num_heads times in parallel on slices of the hidden vector.

    wq, wk, wv, wo: [E, E] with E = hidden_size = num_heads * head_dim.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        wq: mx.array,
        wk: mx.array,
        wv: mx.array,
        wo: mx.array,
    ):
        raise NotImplementedError(
            "Week 1 Day 1 Task 3: SimpleMultiHeadAttention.__init__ (keep the weights)"
        )

    def __call__(
        self,
        query: mx.array,
        key: mx.array,
        value: mx.array,
        mask: mx.array | None = None,
    ) -> mx.array:
        """query: [N, L, E], key and value: [N, S, E], mask: [L, S] -> [N, L, E]."""
        raise NotImplementedError(
            "Week 1 Day 1 Task 3: SimpleMultiHeadAttention (project, split heads, "
            "attend, merge, project)"
        )


def causal_mask(L: int, S: int, dtype: mx.Dtype) -> mx.array:
    """The chunk mask [L, S]: 0 where query i may see key j, -inf elsewhere.

    The L queries are the last L of the S positions, so query i sits at absolute
    position S - L + i and sees key j iff j <= S - L + i. L == S is the ordinary
    causal mask; L == 1 (one decoded token) masks nothing.
    """
    raise NotImplementedError(
        "Week 1 Day 3 Task 1: causal_mask (0 where j <= S - L + i, else -inf)"
    )


def scaled_dot_product_attention_grouped(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | str | None = None,
) -> mx.array:
    """Grouped-query attention: H_q query heads share H key/value heads.

    query: [B, H_q, L, D], key and value: [B, H, S, D] -> [B, H_q, L, D], where
    H_q = n_repeats * H. Query heads h * n_repeats .. (h + 1) * n_repeats - 1 use
    key/value head h. Instead of copying K and V n_repeats times, the query is
    reshaped to [B, H, n_repeats, L, D] and K, V to [B, H, 1, S, D]: broadcasting
    does the sharing. mask: additive, broadcastable to [B, H_q, L, S], or
    "causal" for causal_mask(L, S).
    """
    raise NotImplementedError(
        "Week 1 Day 3 Task 2: scaled_dot_product_attention_grouped (reshape, attend, "
        "reshape back)"
    )
