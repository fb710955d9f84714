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

The final norm and the LM head run only on the rows that are sampled: the B decode
rows and the last position of each chunk that finishes its prompt.
"""

from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import mlx.core as mx

from .kv_cache import BatchingKvCache, TinyKvCache
from .qwen2_week2 import Qwen2ModelWeek2, check_offset


@dataclass
class PrefillChunk:
    """One request's prefill chunk inside a mixed step.

    tokens: prompt tokens at positions offset .. offset + L - 1.
    offset: the absolute position of tokens[0]; it must equal the cache's offset.
    cache: the request's own cache, one per layer (as Request.kv_cache).
    wants_logits: True when the chunk ends its prompt: its last position is sampled.
    """

    tokens: list[int]
    offset: int
    cache: list[TinyKvCache]
    wants_logits: bool


def mixed_forward(
    model: Qwen2ModelWeek2,
    decode_tokens: list[int],
    decode_offsets: list[int],
    batch_cache: list[BatchingKvCache] | None,
    chunks: list[PrefillChunk],
) -> tuple[mx.array | None, list[mx.array | None]]:
    """ONE forward for a step: returns (decode logits [B, V] for the B decode rows, or
    None when decode_tokens is empty; and for each chunk its last-position logits
    [1, V] or None).

    decode_tokens, decode_offsets: one per batch-cache row fed this step (from the
    rows in use to max_active_requests), an empty slot's row carrying a dummy token;
    each offset must be its row's count in the batch cache, as each chunk's offset
    must be its cache's (check_offset). Every cache given is updated as the separate
    forwards would: the batch cache by one token per row, each chunk's cache by its
    tokens. Nothing is evaluated here.
    """
    B = len(decode_tokens)
    if B and batch_cache is None:
        raise ValueError("decode tokens need the batch cache their rows live in")
    if len(decode_offsets) != B:
        raise ValueError(
            f"{B} decode tokens but {len(decode_offsets)} offsets: one offset per row"
        )
    if any(not chunk.tokens for chunk in chunks):
        raise ValueError("a prefill chunk needs at least one token")
    for layer in range(model.num_layers):
        if B:
            check_offset(decode_offsets, batch_cache[layer])
        for chunk in chunks:
            check_offset(chunk.offset, chunk.cache[layer])
    step_tokens = decode_tokens + [t for chunk in chunks for t in chunk.tokens]
    if not step_tokens:
        return None, []
    ends = list(accumulate((len(chunk.tokens) for chunk in chunks), initial=B))
    row_offsets = mx.array(decode_offsets)

    def attend_by_part(layer: int, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        """q: [1, H_q, T, D], k and v: [1, H, T, D] -> [1, H_q, T, D]."""
        attention = model.layers[layer].attention
        parts = []
        if B:
            # [1, H, B, D] -> [B, H, 1, D]: each decode token is its own batch row.
            rows = [x[:, :, :B].swapaxes(0, 2) for x in (q, k, v)]
            out = attention.attend(*rows, row_offsets, batch_cache[layer])
            parts.append(out.swapaxes(0, 2))
        for chunk, start, end in zip(chunks, ends, ends[1:]):
            part = [x[:, :, start:end] for x in (q, k, v)]
            parts.append(attention.attend(*part, chunk.offset, chunk.cache[layer]))
        return mx.concatenate(parts, axis=2)

    h = model.embedding(mx.array([step_tokens]))  # [1, T, E]
    for number, layer in enumerate(model.layers):
        h = layer.forward(h, partial(attend_by_part, number))
    last_rows = [end - 1 for end in ends[1:]]
    sampled = list(range(B)) + [
        row for chunk, row in zip(chunks, last_rows) if chunk.wants_logits
    ]
    if not sampled:
        return None, [None] * len(chunks)
    logits = model.logits(h[0, mx.array(sampled)])  # [len(sampled), V]
    by_row = {row: logits[i : i + 1] for i, row in enumerate(sampled)}
    chunk_logits = [
        by_row[row] if chunk.wants_logits else None
        for chunk, row in zip(chunks, last_rows)
    ]
    return (logits[:B] if B else None), chunk_logits
