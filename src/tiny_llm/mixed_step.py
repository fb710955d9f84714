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

import mlx.core as mx

from .kv_cache import BatchingKvCache, TinyKvCache
from .qwen2_week2 import Qwen2ModelWeek2, check_offset  # noqa: F401


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
    raise NotImplementedError(
        "Week 3 Day 1: mixed_forward: check every offset (check_offset); embed the "
        "decode tokens and all chunks' tokens as one sequence [1, T]; run each layer "
        "with layer.forward(h, attend), where attend(q, k, v) cuts q, k, v [1, H, T, "
        "D] along T: the first B tokens become B rows [B, H, 1, D] "
        "(swapaxes(0, 2)) for attention.attend with the decode offsets and the batch "
        "cache, each chunk's slice goes to attention.attend at chunk.offset with "
        "chunk.cache; concatenate the outputs back along T. Then model.logits only "
        "on the decode rows and the last row of each chunk that wants_logits"
    )
