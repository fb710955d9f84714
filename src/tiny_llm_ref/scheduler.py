"""batch_generate: a list of prompts in, one result per prompt out.

It is the engine's simplest client: it adds every prompt to an Engine, steps it until
no request is left, and keeps each request's result as it finishes. What one step does
(continuous batching, chunked prefill, priorities, failures that cost only the
requests they touch) is the engine's: see engine.py.
"""

import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from tiny_llm_base import (
    BatchResults,
    PromptSpec,
    SchedulerSnapshot,
    check_batch_arguments,
)

from .engine import ChunkPolicy, Engine


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
    policy: str = "alternate",
    token_budget: int | None = None,
    kv_cache: str = "dense",
    block_size: int = 16,
    num_blocks: int | None = None,
    prefix_caching: bool = True,
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
    policy: "alternate" (days 6 and 7: a chunk's forward, then the decodes') or
        "mixed" (week 3 day 1: one forward a step); token_budget: the most tokens
        one mixed step runs (None: no limit). See Engine.
    kv_cache, block_size, num_blocks, prefix_caching: the Engine's KV cache
        ("dense", or "paged" with week 3 days 2 and 3); passed on as they are.
    on_step: called with a SchedulerSnapshot at the end of every iteration.
    clock: every time in the metrics is a reading of it. The scheduler reads a
        request's `arrival` when it admits it and its `prefill_start` just before its
        first chunk; the request reads a token's time when it accepts the token.

    The run is a short loop over an Engine: add every prompt, then step until no
    request is left, collecting each request's result as it finishes. With the
    alternate policy, every iteration (Engine.step): admit the requests whose
    arrival_step the iterations done so far have reached; run one prefill chunk of a
    waiting request that will find a slot (interactive first, then the first
    admitted); move every prefilled request into a free slot, the lowest first
    (add_request on every layer); run one decode step over the slots up to the
    highest in use, the batch cache's `rows` (an empty slot among them feeds token 0
    at offset 0), freeing the slots of finished requests (remove_request on every
    layer); call on_step.

    Bad arguments raise TypeError (a wrong type; a bool is not an int) or
    ValueError naming the argument: check_batch_arguments checks them all (the
    engine's settings through check_engine_arguments) and returns the prompts as
    PromptSpecs. A bad prompt or per-prompt setting fails that request alone
    (the Request checks it). A prefill that raises fails its
    request; a decode forward that raises fails every request in it and frees their
    slots; a sampler that fails fails its request (sample_and_accept). The run goes
    on with the others.
    """
    specs = check_batch_arguments(
        model,
        prompts,
        batch_size,
        prefill_step,
        max_seq_len,
        max_tokens,
        sampler,
        reserved_interactive_slots,
        on_step,
        clock,
        policy,
        token_budget,
    )
    engine = Engine(
        model,
        tokenizer,
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        prefill_step=prefill_step,
        policy=policy,
        token_budget=token_budget,
        max_tokens=max_tokens,
        sampler=sampler,
        reserved_interactive_slots=reserved_interactive_slots,
        clock=clock,
        kv_cache=kv_cache,
        block_size=block_size,
        num_blocks=num_blocks,
        prefix_caching=prefix_caching,
    )
    ids = [engine.add_request(spec) for spec in specs]
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                finished[output.request_id] = output.result
        if on_step:
            on_step(engine.snapshot())
    results = BatchResults(finished[i] for i in ids)
    results.metrics = engine.metrics
    return results
