"""Fast paths for MLX's CPU backend: exp built from elementwise ops, and attention
over a long context laid out for the CPU.

MLX's CPU backend computes `mx.exp` one element at a time, about 15 ns each on the
course machine, and a softmax over a long context is mostly exps: a 128-token chunk
at position 2,000 takes 9 heads x 128 x 2,128 = 2.5 M of them in every layer.
`fast_exp` writes exp with operations that `mx.compile` fuses into loops the C++
compiler vectorizes (ten times faster here), and `cpu_attention` is attention
arranged around it: scores laid out keys-down so the softmax's max is a fast
reduction, the causal mask written only where it hides something, and blocks small
enough to stay in cache.
On a GPU none of this is needed: `mx.fast.scaled_dot_product_attention` is one fused
kernel there (week 2 day 3).
"""

import math
from functools import lru_cache

import mlx.core as mx

from .attention import causal_mask

LN2 = math.log(2.0)
# Adding then subtracting 1.5 * 2**23 rounds a float32 of magnitude below 2**22 to
# the nearest integer: at that size float32 keeps no fraction bits. Unlike mx.round,
# it compiles to vector instructions on a baseline x86-64 CPU. It relies on strict
# float arithmetic, which MLX's backends use (no fast-math reassociation).
ROUND_TO_INTEGER = 1.5 * 2**23
MANTISSA_BITS = 2**23  # a float32's exponent field starts at bit 23
# Scores per block of cpu_attention: 2 MB of float32, so that a block's arrays stay
# in the CPU's cache and in MLX's buffer cache (its CPU default keeps 32 MB).
SCORE_BLOCK = 1 << 19
# A long causal chunk is cut into blocks of at most this many queries, each block
# against only the keys it can see.
QUERY_BLOCK = 128
# Attention with at most this many scores in all: attend_few. Its softmax's exps cost
# ~10 ns each, but it takes a dozen fewer operations (~3 us each) than attend_block;
# the two measured level at ~9,000 scores of one query per row.
FEW_SCORES = 8192


# ANCHOR: fast_exp
@mx.compile
def fast_exp(x: mx.array) -> mx.array:
    """exp(x) in float32 from elementwise ops, fused by mx.compile.

    x = n ln2 + g with n an integer and |g| <= ln2 / 2, so exp(x) = 2^n e^g: e^g is
    its Taylor polynomial of degree 6 (relative error below 3e-7) and 2^n is built
    directly as float32 bits, exponent field n + 127. Relative error below 5e-6 for
    normal results (as mx.exp: most of it is rounding x itself); -inf and anything
    below -126.5 ln2 (about -87.7) give exactly 0 (n = -127 makes all bits zero),
    results below 2^-126 may lose precision, and x from 127.5 ln2 (about 88.4) gives
    inf (the true exp overflows at 88.72).
    """
    # Week 2 Day 3 Task 1: fast_exp: clip x (as float32) to [-127 ln2, 128 ln2]; n =
    # round(x / ln2) by adding and subtracting ROUND_TO_INTEGER; bits = ((n + 127) *
    # MANTISSA_BITS).astype(int32), read as float32 with mx.view, is 2^n; recover n
    # from bits (bits.astype(float32) / MANTISSA_BITS - 127) so mx.compile makes two
    # loops, one on each side of the view; g = x - n ln2; return e^g's Taylor
    # polynomial (1/k! for k = 0..6, grouped as pairs) times 2^n
    x = mx.clip(x.astype(mx.float32), -127 * LN2, 128 * LN2)
    n = (x * (1 / LN2) + ROUND_TO_INTEGER) - ROUND_TO_INTEGER
    bits = ((n + 127.0) * MANTISSA_BITS).astype(mx.int32)
    # n once more, from bits: everything before mx.view (not fusable) then compiles
    # into one loop and everything after into another; using the first n after the
    # view too would make mx.compile cut the work into more loops and passes.
    n = bits.astype(mx.float32) * (1 / MANTISSA_BITS) - 127.0
    g = x - n * LN2
    g2 = g * g
    # 1 + g + g^2/2! + ... + g^6/6!, in pairs, so the chain of dependent ops is short.
    e_g = (1.0 + g) + g2 * (1 / 2 + g / 6) + (g2 * g2) * ((1 / 24 + g / 120) + g2 / 720)
    return e_g * mx.view(bits, mx.float32)
    # ANCHOR_END: fast_exp


class ShapeLimitedCompile:
    """mx.compile(fn), begun afresh after `limit` different input shapes.

    mx.compile traces a function once for each combination of input shapes and keeps
    every trace in a list that each call searches from the start. Attention over a
    context sees new shapes all the time (a decode step's keys grow by one), so that
    list would grow without end, and each call would search it: 6,000 shapes make a
    call about 0.2 ms slower. Begun afresh, the old traces are freed; that costs about
    10 ms once every `limit` new shapes.
    """

    def __init__(self, fn, limit: int = 256):
        self.fn, self.limit = fn, limit
        self.compiled, self.shapes = mx.compile(fn), set()

    def __call__(self, *arrays: mx.array) -> mx.array:
        key = tuple((a.shape, a.dtype) for a in arrays)
        if key not in self.shapes:
            if len(self.shapes) >= self.limit:
                self.compiled, self.shapes = mx.compile(self.fn), set()
            self.shapes.add(key)
        return self.compiled(*arrays)


def shifted_exp(scores: mx.array, row_max: mx.array) -> mx.array:
    """exp(scores - row_max): a softmax's numerators."""
    # Week 2 Day 3 Task 1: shifted_exp: fast_exp(scores - row_max)
    return fast_exp(scores - row_max)


# shifted_exp compiled: the subtraction runs inside fast_exp's fused loops.
softmax_numerators = ShapeLimitedCompile(shifted_exp)


# ANCHOR: attend_block
def attend_block(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    mask: mx.array | str | None,
    first_position: int,
) -> mx.array:
    """Attention of one block of queries, with the keys down the rows of the scores.

    q: [..., R, n, D], already scaled: R query heads sharing one key/value head, the
    same n queries in each, at positions first_position .. first_position + n - 1.
    k, v: [..., S, D]. The leading axes are [B] for one key/value head or [B, H] for
    all of them. mask: "causal" (query i sees keys 0 .. first_position + i), None, or
    an additive array [..., R, n, S]. Returns [..., R, n, D] in float32.

    The scores' columns are q reshaped [..., R * n, D]: column r * n + i is head r's
    query i. Under "causal" key first_position + 1 + a is hidden from query i when
    a >= i, its score -inf; with one query (n == 1) no key is hidden.
    """
    # Week 2 Day 3 Task 2: attend_block: for "causal", keep only the keys the last query
    # sees; scores = k @ q^T, [..., keys, R * n]; for "causal", overwrite in place
    # (scores[..., hidden:, :] = ...) the rows of the keys some query must not see with
    # a where() over their own small matmul (those keys @ q^T again); add
    # an array mask (its key axis moved in front of R, n); the max and the sum over the
    # keys (axis -2), softmax_numerators, then (p^T @ v) / sum
    *lead, R, n, D = q.shape
    if isinstance(mask, str):
        k, v = k[..., : first_position + n, :], v[..., : first_position + n, :]
    S = k.shape[-2]
    q = q.reshape(*lead, R * n, D).swapaxes(-1, -2)  # [..., D, R * n]
    # Keys down the rows: the max over keys is then a reduction down columns, which
    # measured faster than one along rows on MLX's CPU backend, and the keys the
    # causal mask hides are the last rows, a contiguous slice.
    scores = k @ q  # [..., S, R * n]
    if isinstance(mask, str):
        # Every query here sees the keys before `hidden`: only the last n - 1 rows
        # need the mask. They are computed again on their own and written in place.
        hidden = first_position + 1
        if hidden < S:
            query_positions = mx.tile(mx.arange(first_position, first_position + n), R)
            key_positions = mx.arange(hidden, S)[:, None]
            scores[..., hidden:, :] = mx.where(
                key_positions <= query_positions, k[..., hidden:, :] @ q, -mx.inf
            )
    elif mask is not None:
        mask = mx.moveaxis(mask.astype(mx.float32), -1, -3)  # [..., S, R, n]
        scores = (scores.reshape(*lead, S, R, n) + mask).reshape(*lead, S, R * n)
    numerators = softmax_numerators(scores, mx.max(scores, axis=-2, keepdims=True))
    total = mx.sum(numerators, axis=-2)[..., None]  # [..., R * n, 1]
    out = (numerators.swapaxes(-1, -2) @ v) / total  # [..., R * n, D]
    return out.reshape(*lead, R, n, D)
    # ANCHOR_END: attend_block


# ANCHOR: attend_few
def attend_few(
    q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None
) -> mx.array:
    """Attention of few scores in few operations: a decode step's at a short context,
    or a decode token's and its drafts' (week 3 day 4).

    q: [B, H, R, n, D], already scaled; k, v: [B, H, S, D]; mask None or additive,
    broadcastable to the scores [B, H, R * n, S] (head r's query i on row r * n + i).
    Returns [B, H, R * n, D] in float32. The scores run along the rows, through
    mx.softmax: one operation.
    """
    # Week 2 Day 3 Task 2: attend_few: scores = q as [B, H, R * n, D] @ k^T (plus the
    # mask), mx.softmax over the keys, @ v
    *lead, R, n, D = q.shape
    scores = q.reshape(*lead, R * n, D) @ k.swapaxes(-1, -2)
    if mask is not None:
        scores = scores + mask
    return mx.softmax(scores, axis=-1) @ v
    # ANCHOR_END: attend_few


@lru_cache(maxsize=16)
def causal_rows(R: int, L: int, S: int) -> mx.array:
    """The "causal" mask of attend_few's scores, additive [R * L, S] float32: week 1
    day 3's causal_mask (L queries, the last L of S positions) for each of R heads.
    Every layer of a step asks for the same one, so it is built once, not in every
    layer (1 to 2 ms a forward)."""
    # Week 2 Day 3 Task 2: causal_rows: causal_mask(L, S, float32) repeated R times
    # along the rows (mx.tile)
    return mx.tile(causal_mask(L, S, mx.float32), (R, 1))


# ANCHOR: cpu_attention
def cpu_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """Grouped attention for MLX's CPU backend, in blocks that stay in cache.

    q: [B, H_q, L, D], k and v: [B, H, S, D] -> [B, H_q, L, D] in q's dtype; the
    softmax runs in float32. mask: "causal" (the chunk mask: the L queries are the
    last L of the S positions), None, or an array broadcastable to [B, H_q, L, S]
    (additive, or boolean: True keeps a key). At most FEW_SCORES scores in all (a
    decode step at a short context, a decode token and its drafts) is attend_few
    (a "causal" mask as causal_rows). When all the scores fit in SCORE_BLOCK (a
    longer decode step, a short chunk) every head is one attend_block. Otherwise
    each key/value head is, its queries cut into blocks of about SCORE_BLOCK scores
    (a causal chunk also into blocks of at most QUERY_BLOCK queries, each against
    only the keys it sees). Any other mask name
    raises ValueError with a message that names "causal", the one named mask (the
    tests check for that word).
    """
    # Week 2 Day 3 Task 2: cpu_attention: refuse a mask name other than "causal"
    # (ValueError, the message naming "causal"); a boolean mask becomes additive, an
    # array mask is broadcast to [B, H_q, L, S]; scale q; q [B, H, n_repeats, L, D], the
    # mask [B, H, n_repeats, L, S], k and v in float32; if B * H_q * L * S <=
    # FEW_SCORES, attend_few (the mask as [B, H, n_repeats * L, S]; "causal" as
    # causal_rows, or None for one query: it hides nothing there); if B * H_q *
    # L * S <= SCORE_BLOCK (and L <= QUERY_BLOCK for "causal"), one attend_block for
    # all heads; else attend_block for each kv head and block of queries (blocks =
    # ceil(B * n_repeats * L * S / SCORE_BLOCK), for "causal" at least ceil(L /
    # QUERY_BLOCK), each of ceil(L / blocks) queries; an array mask sliced to the head
    # and the block; a block's queries start at position S - L + start), joined along
    # L, then the heads stacked; [B, H_q, L, D] in q's dtype. Read FEW_SCORES,
    # SCORE_BLOCK and QUERY_BLOCK when called: the tests change them
    B, H_q, L, D = q.shape
    H, S = k.shape[1], k.shape[2]
    n_repeats, dtype = H_q // H, q.dtype
    if isinstance(mask, str) and mask != "causal":
        raise ValueError(f"mask must be an array, 'causal' or None, not {mask!r}")
    if isinstance(mask, mx.array):
        if mask.dtype == mx.bool_:
            mask = mx.where(mask, 0.0, -mx.inf)
        mask = mx.broadcast_to(mask, (B, H_q, L, S)).reshape(B, H, n_repeats, L, S)
    q = (q.astype(mx.float32) * scale).reshape(B, H, n_repeats, L, D)
    k, v = k.astype(mx.float32), v.astype(mx.float32)
    causal = isinstance(mask, str)
    if B * H_q * L * S <= FEW_SCORES:
        if causal:
            mask = causal_rows(n_repeats, L, S) if L > 1 else None
        elif mask is not None:
            mask = mask.reshape(B, H, n_repeats * L, S)
        return attend_few(q, k, v, mask).reshape(B, H_q, L, D).astype(dtype)
    if B * H_q * L * S <= SCORE_BLOCK and not (causal and L > QUERY_BLOCK):
        return attend_block(q, k, v, mask, S - L).reshape(B, H_q, L, D).astype(dtype)
    blocks = math.ceil(B * n_repeats * L * S / SCORE_BLOCK)
    if causal:
        blocks = max(blocks, math.ceil(L / QUERY_BLOCK))
    size = math.ceil(L / blocks)
    heads = []
    for h in range(H):
        parts = []
        for start in range(0, L, size):
            end = min(start + size, L)
            part_mask = mask if causal or mask is None else mask[:, h, :, start:end]
            parts.append(
                attend_block(
                    q[:, h, :, start:end], k[:, h], v[:, h], part_mask, S - L + start
                )
            )
        heads.append(mx.concatenate(parts, axis=2))
    return mx.stack(heads, axis=1).reshape(B, H_q, L, D).astype(dtype)
    # ANCHOR_END: cpu_attention
