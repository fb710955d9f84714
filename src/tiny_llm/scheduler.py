"""Continuous batching with chunked prefill.

Every iteration of the loop does two things: one prefill chunk for the most urgent
waiting request, then one decode step that gives every decoding request its next
token. A request whose prefill is done takes a free decode slot at once, and a
finished request frees its slot for the next one. A long prompt therefore never
stalls the decoders for longer than one chunk.

Priorities: an interactive request's chunks go ahead of a batch request's remaining
chunks (the batch prefill pauses between chunks and resumes at its offset), and
batch requests never hold more than batch_size - reserved_interactive_slots decode
slots, so that the rest stay free for interactive requests.
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
from .kv_cache import BatchingKvCache  # noqa: F401
from .metrics import RunMetrics  # noqa: F401
from .request import PromptSpec, Request  # noqa: F401

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

    prompts: texts, token-id lists or PromptSpecs; a PromptSpec's max_tokens and
        sampler override the defaults given here (sampler default: greedy).
    batch_size: decode slots. The batch cache is one BatchingKvCache(batch_size,
        max_seq_len) per layer; count the layers as len(model.create_kv_cache()),
        since `model` may be a wrapper with only __call__ and create_kv_cache.
    prefill_step: prompt tokens per prefill chunk; None prefills each prompt whole;
        or a policy asked before each chunk: a function called as
        policy(prompt tokens, requests in decode slots, batch_size), such as
        select_chunk_size, or an AdaptiveChunker, asked with
        select_chunk_size(requests in decode slots, batch_size) and told
        record(seconds) after the chunk.
    max_seq_len: positions per slot in the batch cache.
    reserved_interactive_slots: batch requests together never hold more than
        batch_size - reserved_interactive_slots decode slots, even when no
        interactive request is waiting (a prefilled batch request waiting for a slot
        counts as holding one). Interactive requests may take any free slot.
    on_step: called with a SchedulerSnapshot at the end of every iteration.
    clock: every time in the metrics is a reading of it. The scheduler reads a
        request's `arrival` when it admits it and its `prefill_start` just before its
        first chunk; the request reads a token's time when it accepts the token.

    Every iteration: admit the requests whose arrival_step equals the iterations
    done so far; run one prefill chunk of a waiting request that will find a slot
    (interactive first, then the first admitted); move every prefilled request into a
    free slot (add_request on every layer); run one decode step for all slots (an
    empty slot feeds token 0 at offset 0), freeing the slots of finished requests
    (remove_request on every layer); call on_step.

    A bad prompt or per-prompt setting fails that request alone. Bad arguments here
    raise ValueError naming the argument: batch_size, max_seq_len or max_tokens
    below 1, an int prefill_step below 1, reserved_interactive_slots outside
    [0, batch_size), an arrival_step below 0.
    """
    raise NotImplementedError(
        "Week 2 Day 6: batch_generate: validate the arguments, make one Request per "
        "prompt (prefill_max_step=None, the scheduler picks chunk sizes), then loop "
        "until every request is finished: admit arrivals, prefill a waiting request "
        "that will find a slot, move prefilled requests into free decode slots "
        "(add_request on every layer), run one decode step for all slots, free "
        "finished slots (remove_request on every layer), record the metrics, call "
        "on_step; return BatchResults with .metrics. Day 6 prefills each prompt "
        "whole (prefill_step=None); Day 7 adds one chunk per iteration sized by "
        "prefill_step, interactive requests first, and reserved_interactive_slots"
    )
