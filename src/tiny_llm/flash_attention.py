"""Flash attention: exact attention computed one key/value tile at a time.

Plain attention builds the whole [L, S] score matrix before its softmax. Here the
softmax is taken online: each query row keeps its running max, the running sum of
exp(score - max) and an accumulator of exp(score - max) * value. When a new tile
raises the max, the sum and the accumulator are rescaled by exp(old max - new max).
At the end accumulator / sum is the softmax-weighted sum of the values, exactly.
Only one [query_tile, key_tile] block of scores exists at any time.
"""

import math

import mlx.core as mx


def flash_attention(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    scale: float | None = None,
    mask: mx.array | str | None = None,
    query_tile: int = 64,
    key_tile: int = 64,
) -> mx.array:
    """softmax(query @ key^T * scale + mask) @ value, without the [L, S] scores.

    query: [B, H_q, L, D]; key, value: [B, H, S, D]; H_q is a multiple of H and each
    group of H_q / H query heads shares one key/value head (K and V are not repeated).
    scale: defaults to 1 / sqrt(D).
    mask: None; an additive float array broadcastable to [B, H_q, L, S]; or "causal",
    the chunk mask: the L queries sit at the end of the S keys, so query i sees key j
    iff j <= (S - L) + i.
    query_tile, key_tile: the tile sizes; the result does not depend on them.
    Returns [B, H_q, L, D] in query's dtype. A row that sees no key at all is zeros.
    """
    raise NotImplementedError(
        "Week 2 Day 4 Task 1: flash_attention: check the heads and the mask, then cut"
        " the queries into tiles and hand each to _attend_query_tile"
    )


def _attend_query_tile(
    q: mx.array,
    key: mx.array,
    value: mx.array,
    mask: mx.array | None,
    causal: bool,
    rows: range,
    length: int,
    key_tile: int,
) -> mx.array:
    """Online softmax of one query tile q: [B, H, n_repeats, T_q, D] over all keys."""
    raise NotImplementedError(
        "Week 2 Day 4 Task 1: _attend_query_tile: the online softmax of one query "
        "tile over the key tiles (running max, running sum, rescaled accumulator); "
        "add the array mask's tile, or _causal_tile where some row misses some key, "
        "and skip the keys no row of the tile sees"
    )


def _causal_tile(rows: range, cols: range, offset: int) -> mx.array:
    """[T_q, T_k] additive chunk mask: 0 where key j <= offset + query i, else -inf."""
    raise NotImplementedError(
        "Week 2 Day 4 Task 2: _causal_tile: the [T_q, T_k] additive chunk mask of one"
        " tile (0 where key j <= offset + query i, else -inf)"
    )
