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
    # Week 2 Day 4 Task 1: flash_attention: check the heads and the mask, then cut the
    # queries into tiles and hand each to _attend_query_tile
    batch, query_heads, length, head_dim = query.shape
    _, kv_heads, num_keys, _ = key.shape
    if query_heads % kv_heads != 0:
        raise ValueError(
            f"{query_heads} query heads cannot share {kv_heads} key/value heads: "
            "the number of query heads must be a multiple of the key/value heads"
        )
    n_repeats = query_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if isinstance(mask, str) and mask != "causal":
        raise ValueError(f'unknown mask "{mask}": the only named mask is "causal"')
    causal = isinstance(mask, str)
    mask_array = None
    if isinstance(mask, mx.array):
        if mask.dtype == mx.bool_:
            raise ValueError(
                "flash_attention takes an additive float mask (0 to keep, -inf to "
                "drop); turn a boolean mask into one with mx.where(mask, 0, -mx.inf)"
            )
        # A broadcast view: no [L, S] copy is made; tiles are cut from it.
        mask_array = mx.broadcast_to(mask, (batch, query_heads, length, num_keys))

    # [B, H, n_repeats, L, D]: the query heads that share kv head h sit under h.
    queries = query.reshape(batch, kv_heads, n_repeats, length, head_dim)
    outputs = []
    for start in range(0, length, query_tile):
        rows = range(start, min(start + query_tile, length))
        q = queries[..., rows.start : rows.stop, :].astype(mx.float32) * scale
        outputs.append(
            _attend_query_tile(
                q, key, value, mask_array, causal, rows, length, key_tile
            )
        )
    output = mx.concatenate(outputs, axis=3)
    return output.reshape(batch, query_heads, length, head_dim).astype(query.dtype)


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
    # Week 2 Day 4 Task 1: _attend_query_tile: the online softmax of one query tile over
    # the key tiles (running max, running sum, rescaled accumulator); add the array
    # mask's tile, or _causal_tile where some row misses some key, and skip the keys no
    # row of the tile sees
    num_keys = key.shape[2]
    offset = num_keys - length  # query i sits at absolute position offset + i
    # Keys past what the tile's last row may see are masked for every row: skip them.
    keys_seen = max(0, offset + rows.stop) if causal else num_keys

    running_max = mx.full((*q.shape[:-1], 1), -mx.inf, dtype=mx.float32)
    running_sum = mx.zeros_like(running_max)
    accumulator = mx.zeros(q.shape, dtype=mx.float32)
    for start in range(0, keys_seen, key_tile):
        cols = range(start, min(start + key_tile, keys_seen))
        # [B, H, 1, T_k, D]: broadcast over the n_repeats query heads of a group.
        k = key[:, :, None, cols.start : cols.stop].astype(mx.float32)
        v = value[:, :, None, cols.start : cols.stop].astype(mx.float32)
        scores = q @ k.swapaxes(-1, -2)  # [B, H, n_repeats, T_q, T_k]
        if causal:
            if cols.stop - 1 > offset + rows.start:  # some row misses some key
                scores = scores + _causal_tile(rows, cols, offset)
        elif mask is not None:
            tile = mask[:, :, rows.start : rows.stop, cols.start : cols.stop]
            scores = scores + tile.reshape(scores.shape)

        new_max = mx.maximum(running_max, scores.max(axis=-1, keepdims=True))
        # A row that has seen only masked keys still has max -inf, and
        # exp(-inf - -inf) is NaN; shifting such a row by 0 gives exp(-inf) = 0.
        shift = mx.where(new_max == -mx.inf, 0.0, new_max)
        probs = mx.exp(scores - shift)
        rescale = mx.exp(running_max - shift)
        running_sum = running_sum * rescale + probs.sum(axis=-1, keepdims=True)
        accumulator = accumulator * rescale + probs @ v
        running_max = new_max
        # Evaluate now: left lazy, MLX may compute many tiles of scores before it
        # consumes them, and the peak memory grows with S again.
        mx.eval(running_max, running_sum, accumulator)
    return accumulator / mx.where(running_sum == 0, 1.0, running_sum)


def _causal_tile(rows: range, cols: range, offset: int) -> mx.array:
    """[T_q, T_k] additive chunk mask: 0 where key j <= offset + query i, else -inf."""
    # Week 2 Day 4 Task 2: _causal_tile: the [T_q, T_k] additive chunk mask of one tile
    # (0 where key j <= offset + query i, else -inf)
    query_pos = mx.arange(rows.start, rows.stop)[:, None] + offset
    key_pos = mx.arange(cols.start, cols.stop)[None, :]
    return mx.where(key_pos <= query_pos, 0.0, -mx.inf)
