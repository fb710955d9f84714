"""Continuous batching with chunked prefill.

Every iteration of the loop does two things: one prefill chunk for the most urgent
waiting request, then one decode step that gives every decoding request its next
token. A request whose prefill is done takes a free decode slot at once, and a
finished request frees its slot for the next one. A long prompt therefore never
stalls the decoders for longer than one chunk.

Priorities: an interactive request's chunks go ahead of a batch request's remaining
chunks (the batch prefill pauses between chunks and resumes at its offset), and
`reserved_interactive_slots` decode slots are kept for interactive requests.
"""

import time
from collections.abc import Callable, Sequence

import mlx.core as mx

# Infrastructure, not course material: given by tiny_llm_base.
from tiny_llm_base import (  # noqa: F401
    BatchResults,
    SchedulerSnapshot,
    SlotView,
    greedy,
)

from .chunking import AdaptiveChunker
from .request import PromptSpec

ChunkPolicy = int | None | AdaptiveChunker | Callable[[int, int, int], int]


def batch_generate(
    model,
    tokenizer,
    prompts: Sequence[str | list[int] | PromptSpec],
    batch_size: int = 5,
    prefill_step: ChunkPolicy = 128,
    max_seq_len: int = 512,
    max_tokens: int | None = None,
    sampler: Callable[[mx.array], mx.array] | None = None,
    reserved_interactive_slots: int = 0,
    on_step: Callable[[SchedulerSnapshot], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchResults:
    """Generate for every prompt, batch_size at a time; returns results in prompt order.

    prefill_step: tokens per prefill chunk; None prefills each prompt whole; or a
    policy: select_chunk_size or an AdaptiveChunker. max_tokens and sampler are
    defaults that a PromptSpec may override (sampler default: greedy).
    """
    raise NotImplementedError(
        "Week 2 Day 6: batch_generate: validate the arguments, make one Request per "
        "prompt, then loop until every request is finished: admit arrivals, prefill "
        "a waiting request, move it into a free decode slot "
        "(BatchingKvCache.add_request), run one decode step for all slots, free "
        "finished slots, call on_step with a snapshot. Day 7 adds chunking: one "
        "prefill chunk per iteration (interactive requests first), sized by "
        "prefill_step, plus the run's metrics"
    )
