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

A failure costs only the requests it touches: a failed prefill chunk fails its
request, a failed decode forward the requests in it, and the run goes on.
"""

import time
from collections.abc import Callable, Sequence

import mlx.core as mx

# Infrastructure, not course material: given by tiny_llm_base.
from tiny_llm_base import (  # noqa: F401
    BatchResults,
    SchedulerSnapshot,
    SlotView,
    check_batch_arguments,
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

    prompts: a list of texts, token-id lists or PromptSpecs; a PromptSpec's
        max_tokens and sampler override the defaults given here (sampler default:
        greedy).
    batch_size: decode slots. The batch cache is one BatchingKvCache(batch_size,
        max_seq_len) per layer; count the layers as len(model.create_kv_cache()),
        since `model` may be a wrapper with only __call__, create_kv_cache,
        vocab_size and context_length.
    prefill_step: prompt tokens per prefill chunk; None prefills each prompt whole;
        or a policy asked before each chunk: a function called as
        policy(prompt tokens, requests in decode slots, batch_size), such as
        select_chunk_size, or an AdaptiveChunker, asked with
        select_chunk_size(requests in decode slots, batch_size) and told
        record(seconds) after the chunk.
    max_seq_len: positions per slot in the batch cache, at most
        model.context_length.
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
    free slot, the lowest first (add_request on every layer); run one decode step
    over the slots up to the highest in use, the batch cache's `rows` (an empty
    slot among them feeds token 0 at offset 0), freeing the slots of finished
    requests (remove_request on every layer); call on_step.

    Bad arguments raise TypeError (a wrong type; a bool is not an int) or
    ValueError naming the argument: check_batch_arguments checks them all and
    returns the prompts as PromptSpecs. A bad prompt or per-prompt setting fails
    that request alone (the Request checks it). A prefill that raises fails its
    request; a decode forward that raises fails every request in it and frees their
    slots; a sampler that fails fails its request (sample_and_accept). The run goes
    on with the others.
    """
    raise NotImplementedError(
        "Week 2 Day 6: batch_generate: check_batch_arguments, make one Request per "
        "prompt (prefill_max_step=None, the scheduler picks chunk sizes), then loop "
        "until every request is finished: admit arrivals, prefill a waiting request "
        "that will find a slot (a raise fails that request), move prefilled "
        "requests into the lowest free decode slots (add_request on every layer), "
        "run one decode step over the slots up to the highest in use (a raise fails "
        "the requests in it), free finished slots (remove_request on every layer), "
        "record the metrics, call on_step; return BatchResults with .metrics. Day 6 "
        "prefills each prompt whole (prefill_step=None); Day 7 adds one chunk per "
        "iteration sized by prefill_step, interactive requests first, and "
        "reserved_interactive_slots"
    )
