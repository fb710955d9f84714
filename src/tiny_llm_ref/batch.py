"""batch_generate: a list of prompts in, one result per prompt out.

It is the engine's simplest client: it adds every prompt to an Engine, steps it until
no request is left, and keeps each request's result as it finishes. What one step does
(continuous batching, chunked prefill, priorities, failures that cost only the
requests they touch) is the engine's: see engine.py.
"""

import time
from collections.abc import Callable, Sequence

from tiny_llm_base import BatchResults, EngineConfig, PromptSpec, SchedulerSnapshot
from tiny_llm_base.config import check_callable, prompt_specs

from .engine import Engine


def batch_generate(
    model,
    tokenizer,
    prompts: Sequence[str | list[int] | PromptSpec],
    config: EngineConfig | None = None,
    on_step: Callable[[SchedulerSnapshot], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    **settings,
) -> BatchResults:
    """Generate for every prompt, batch_size at a time; returns results in prompt order.

    prompts: a list of texts, token-id lists or PromptSpecs; a PromptSpec's
        max_tokens and sampler override the config's (sampler default: greedy). A
        PromptSpec with n > 1 gets its choice 0's result, which holds all n in
        `choices`.
    config: the Engine's EngineConfig; keyword `settings` replace its fields
        (batch_generate(model, tokenizer, prompts, batch_size=4, prefill_step=None)).
        `model` may be a wrapper with only __call__, create_kv_cache, vocab_size and
        context_length.
    on_step: called with the engine's SchedulerSnapshot at the end of every
        iteration.
    clock: every time in the metrics is a reading of it. A request's `arrival` is
        read when it is admitted, its `prefill_start` just before its first chunk,
        a token's time when the request accepts the token.

    The run is a short loop over an Engine: add every prompt, then step until no
    request is left, collecting each request's result as it finishes (keyed by
    (request_id, index)); the engine needs no close() here.

    Bad arguments raise TypeError (a wrong type; a bool is not an int) or ValueError
    naming the argument: the EngineConfig checks the settings, prompt_specs the
    prompts. A bad prompt or per-prompt setting fails that request alone (the
    Request checks it), and so does a failing prefill, forward or sampler: the run
    goes on with the others.
    """
    # Week 2 Day 6 Task 4: batch_generate: an Engine, check on_step, prompt_specs, add
    # every prompt, step until none is left, results in prompt order with the metrics (a
    # prompt with n > 1: choice 0's result, its `choices` all n in index order)
    engine = Engine(model, tokenizer, config, clock=clock, **settings)
    check_callable("on_step", on_step)
    specs = prompt_specs(prompts)
    ids = [engine.add_request(spec) for spec in specs]
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.result is not None:
                finished[output.request_id, output.index] = output.result
        if on_step:
            on_step(engine.snapshot())
    for request_id, spec in zip(ids, specs):
        if spec.n > 1:
            choices = [finished[request_id, i] for i in range(spec.n)]
            choices[0].choices = choices
    results = BatchResults(finished[i, 0] for i in ids)
    results.metrics = engine.metrics
    return results
