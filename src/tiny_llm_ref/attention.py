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
    # Week 1 Day 1 Task 2: scaled_dot_product_attention_simple (scores, mask, softmax, @
    # value)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = (query @ key.swapaxes(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    return softmax(scores, axis=-1) @ value


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
        # Week 1 Day 1 Task 3: SimpleMultiHeadAttention.__init__ (keep the weights)
        if hidden_size % num_heads != 0:
            raise ValueError(
                f"hidden_size {hidden_size} must be a multiple of num_heads {num_heads}"
            )
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo

    def __call__(
        self,
        query: mx.array,
        key: mx.array,
        value: mx.array,
        mask: mx.array | None = None,
    ) -> mx.array:
        """query: [N, L, E], key and value: [N, S, E], mask: [L, S] -> [N, L, E]."""
        # Week 1 Day 1 Task 3: SimpleMultiHeadAttention (project, split heads, attend,
        # merge, project)
        n, length, _ = query.shape

        def split_heads(x: mx.array, w: mx.array) -> mx.array:
            # [N, T, E] -> [N, H, T, D]: each head attends independently.
            projected = linear(x, w)
            return projected.reshape(n, -1, self.num_heads, self.head_dim).swapaxes(
                1, 2
            )

        out = scaled_dot_product_attention_simple(
            split_heads(query, self.wq),
            split_heads(key, self.wk),
            split_heads(value, self.wv),
            mask=mask,
        )
        return linear(out.swapaxes(1, 2).reshape(n, length, self.hidden_size), self.wo)


def causal_mask(L: int, S: int, dtype: mx.Dtype) -> mx.array:
    """The chunk mask [L, S]: 0 where query i may see key j, -inf elsewhere.

    The L queries are the last L of the S positions, so query i sits at absolute
    position S - L + i and sees key j iff j <= S - L + i. L == S is the ordinary
    causal mask; L == 1 (one decoded token) masks nothing.
    """
    # Week 1 Day 3 Task 1: causal_mask (0 where j <= S - L + i, else -inf)
    visible = mx.tril(mx.ones((L, S), dtype=mx.bool_), k=S - L)
    return mx.where(visible, mx.array(0, dtype), mx.array(-mx.inf, dtype))


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
    # Week 1 Day 3 Task 2: scaled_dot_product_attention_grouped (reshape, attend,
    # reshape back)
    *batch, h_q, length, dim = query.shape
    h_kv, s = key.shape[-3], key.shape[-2]
    if h_q % h_kv != 0:
        raise ValueError(
            f"{h_q} query heads cannot share {h_kv} key/value heads evenly"
        )
    n_repeats = h_q // h_kv
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be an array, 'causal' or None, not {mask!r}")
        mask = causal_mask(length, s, query.dtype)
    if mask is not None:
        # Split the mask's head axis the same way as the query's.
        mask = mx.broadcast_to(mask, (*batch, h_q, length, s))
        mask = mask.reshape(*batch, h_kv, n_repeats, length, s)
    out = scaled_dot_product_attention_simple(
        query.reshape(*batch, h_kv, n_repeats, length, dim),
        key.reshape(*batch, h_kv, 1, s, dim),
        value.reshape(*batch, h_kv, 1, s, dim),
        scale=scale,
        mask=mask,
    )
    return out.reshape(*batch, h_q, length, dim)
