"""One forward for a whole step: every decoding request's next token and prefill chunks.

Day 7 alternates a chunk's forward with the decode batch's forward. Yet only
attention mixes tokens: the norms, the q/k/v/o projections and the MLP work on each
token alone. So the step's tokens go through those as one sequence, and only
attention is split, each part against its own cache:

    x: [1, T, E], T = B + L_1 + ... + L_n
       | B decode tokens | chunk 1: L_1 tokens | ... | chunk n: L_n tokens |

    q: [1, H_q, T, D], k and v: [1, H, T, D], projected from all T tokens at once
      decode part [:, :, :B]         -> [B, H, 1, D]: one row per batch-cache slot,
                                        RoPE at each row's offset, the batch cache's
                                        per-row mask (day 5)
      chunk c   [:, :, s_c:s_c+L_c]  -> [1, H, L_c, D]: RoPE at chunk.offset, its
                                        request's cache and the chunk mask (day 7)
    the parts' outputs, put back in the same order: [1, H_q, T, D] -> wo -> [1, T, E]

(split_parts cuts [1, H, T, D] into those parts; join_parts glues them back.)

The final norm and the LM head run only on the rows that are sampled: the B decode
rows and the last position of each chunk that finishes its prompt.

This module is the model side only: what a step runs is the mixed policy's plan
(mixed_policy.py), and the model runner (runner.py) builds these inputs from it and
applies the results to the requests.
"""

from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import mlx.core as mx

from .kv_cache import BatchingKvCache, TinyKvCache
from .qwen2_ops import check_offset
from .qwen2_week2 import Qwen2ModelWeek2


@dataclass
class PrefillChunk:
    """One request's prefill chunk inside a mixed step.

    tokens: tokens at positions offset .. offset + L - 1.
    offset: the absolute position of tokens[0]; it must equal the cache's offset.
    cache: the request's own cache, one per layer (as Request.kv_cache).
    logit_rows: how many of the chunk's last positions are sampled: 0, or 1 when the
        chunk ends its prompt; all L for week 3 day 4's draft tokens, each checked.
    """

    tokens: list[int]
    offset: int
    cache: list[TinyKvCache]
    logit_rows: int


def split_parts(
    x: mx.array, decode_rows: int, chunk_lengths: list[int]
) -> tuple[mx.array | None, list[mx.array]]:
    """x: [1, H, T, D] over a step's tokens -> (decode part [B, H, 1, D], or None when
    B = decode_rows is 0; each chunk's part [1, H, L_c, D]).

    The first B tokens are the decode rows: swapping axes 0 and 2 makes each one its
    own batch row, as day 5's decode step has them. The chunks follow, in order.
    """
    # Week 3 Day 1 Task 1: split_parts: the decode part is x[:, :, :B] with axes 0 and 2
    # swapped (None when B is 0); then chunk c is x[:, :, start:end], the chunks one
    # after the other from position B
    decode = x[:, :, :decode_rows].swapaxes(0, 2) if decode_rows else None
    ends = list(accumulate(chunk_lengths, initial=decode_rows))
    return decode, [x[:, :, start:end] for start, end in zip(ends, ends[1:])]


def join_parts(decode: mx.array | None, chunks: list[mx.array]) -> mx.array:
    """split_parts undone: [B, H, 1, D] and each [1, H, L_c, D] -> [1, H, T, D]."""
    # Week 3 Day 1 Task 1: join_parts: swap the decode part's axes 0 and 2 back (when
    # there is one) and concatenate it and the chunks along axis 2
    parts = [] if decode is None else [decode.swapaxes(0, 2)]
    return mx.concatenate(parts + chunks, axis=2)


def mixed_forward(
    model: Qwen2ModelWeek2,
    decode_tokens: list[int],
    decode_offsets: list[int],
    batch_cache: list[BatchingKvCache] | None,
    chunks: list[PrefillChunk],
    with_hidden: bool = False,
) -> tuple:
    """ONE forward for a step: returns (decode logits [B, V] for the B decode rows, or
    None when decode_tokens is empty; and for each chunk the logits [logit_rows, V]
    of its last logit_rows positions, or None when logit_rows is 0). with_hidden
    (week 4 day 3): a third item, the last layer's output (before the final norm)
    on the same rows, [rows, E] in the logits' order (decode rows, then each
    chunk's), or None with no row: what a draft head reads.

    decode_tokens, decode_offsets: one per batch-cache row fed this step (from the
    rows in use to max_active_requests), an empty slot's row carrying a dummy token;
    each offset must be its row's count in the batch cache, as each chunk's offset
    must be its cache's (check_offset). Every cache given is updated as the separate
    forwards would: the batch cache by one token per row, each chunk's cache by its
    tokens. The final norm and LM head run once, on the sampled rows gathered (the
    decode rows, then each chunk's last logit_rows rows); with none,
    no LM head runs and the result is (None, [None] * len(chunks)). Nothing is
    evaluated here. Checked first, in this order, each a ValueError: "decode tokens
    need the batch cache their rows live in"; "{B} decode tokens but {n} offsets:
    one offset per row"; "a prefill chunk needs at least one token"; "a chunk's
    logit_rows must be between 0 and its length"; then check_offset on every layer.
    """
    # Week 3 Day 1 Task 1: mixed_forward: ValueError for decode tokens without a batch
    # cache, a count of offsets unlike the tokens', an empty chunk or a logit_rows
    # outside 0 .. its length; check_offset every layer's caches; embed the decode
    # tokens and every chunk's tokens as one sequence [1, T]; run each layer as
    # layer.forward(h, attend), where attend(q, k, v) cuts q, k, v with split_parts; for
    # each part (the decode rows at their offsets in the batch cache, then each chunk at
    # chunk.offset in chunk.cache[layer]) stages its roped keys and values
    # (cache.stage); only then each part's cache.attend_staged(roped q,
    # attention.attention) (given: attention over cache.fetch_staged()); glues the
    # outputs with join_parts; then model.logits only on the decode rows and the last
    # logit_rows positions of each chunk. Week 4 Day 3: with_hidden, a third item: the
    # rows model.logits read
    B = len(decode_tokens)
    if B and batch_cache is None:
        raise ValueError("decode tokens need the batch cache their rows live in")
    if len(decode_offsets) != B:
        raise ValueError(
            f"{B} decode tokens but {len(decode_offsets)} offsets: one offset per row"
        )
    if any(not chunk.tokens for chunk in chunks):
        raise ValueError("a prefill chunk needs at least one token")
    if any(not 0 <= chunk.logit_rows <= len(chunk.tokens) for chunk in chunks):
        raise ValueError("a chunk's logit_rows must be between 0 and its length")
    for layer in range(model.num_layers):
        if B:
            check_offset(decode_offsets, batch_cache[layer])
        for chunk in chunks:
            check_offset(chunk.offset, chunk.cache[layer])
    step_tokens = decode_tokens + [t for chunk in chunks for t in chunk.tokens]
    if not step_tokens:
        return (None, [], None) if with_hidden else (None, [])
    lengths = [len(chunk.tokens) for chunk in chunks]
    row_offsets = mx.array(decode_offsets)

    def attend_by_part(layer: int, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        """q: [1, H_q, T, D], k and v: [1, H, T, D] -> [1, H_q, T, D]. Every part's
        keys and values are staged in its cache before any part reads: parts that
        share one paged pool (day 2) then cost one write."""
        attention = model.layers[layer].attention
        q_rows, q_chunks = split_parts(q, B, lengths)
        k_rows, k_chunks = split_parts(k, B, lengths)
        v_rows, v_chunks = split_parts(v, B, lengths)
        parts = [
            (q_c, k_c, v_c, chunk.offset, chunk.cache[layer])
            for q_c, k_c, v_c, chunk in zip(q_chunks, k_chunks, v_chunks, chunks)
        ]
        if B:
            parts.insert(0, (q_rows, k_rows, v_rows, row_offsets, batch_cache[layer]))
        for _, k_part, v_part, offset, cache in parts:
            cache.stage(attention.apply_rope(k_part, offset), v_part)
        outs = [
            cache.attend_staged(
                attention.apply_rope(q_part, offset), attention.attention
            )
            for q_part, _, _, offset, cache in parts
        ]
        return join_parts(outs[0] if B else None, outs[1:] if B else outs)

    h = model.embedding(mx.array([step_tokens]))  # [1, T, E]
    for number, layer in enumerate(model.layers):
        h = layer.forward(h, partial(attend_by_part, number))
    # Chunk c spans step positions ends[c] .. ends[c + 1] - 1; its sampled rows are
    # the last logit_rows of them, and they follow each other in `sampled`.
    ends = list(accumulate(lengths, initial=B))
    sampled = list(range(B)) + [
        row
        for chunk, end in zip(chunks, ends[1:])
        for row in range(end - chunk.logit_rows, end)
    ]
    if not sampled:
        nothing = None, [None] * len(chunks)
        return (*nothing, None) if with_hidden else nothing
    hidden = h[0, mx.array(sampled)]  # [len(sampled), E]
    logits = model.logits(hidden)  # [len(sampled), V]
    starts = accumulate([chunk.logit_rows for chunk in chunks], initial=B)
    chunk_logits = [
        logits[start : start + chunk.logit_rows] if chunk.logit_rows else None
        for chunk, start in zip(chunks, starts)
    ]
    result = (logits[:B] if B else None), chunk_logits
    return (*result, hidden) if with_hidden else result
