"""Week 3 Day 1, task 2: a long prompt's caps and the partial-prefill limits, asked
of a MixedPolicy directly (no forward runs).

is_long, chunk_limit and may_start are the rules of the chapter "Who shares a step":
the numbers here are the chapter's (a 40-token prompt under a threshold of 16 and an
attention budget of 200 runs in chunks of 14, 8, 6, 5, 5 and 2).
"""

import numpy as np
import pytest

from tiny_llm_base import EngineConfig

from .solution import tiny

pytestmark = pytest.mark.task(2)


def policy_of(model, **settings):
    config = EngineConfig(batch_size=4, max_seq_len=128, policy="mixed", **settings)
    planner = tiny.Planner(config, tiny.DenseKvManager(model, config))
    return tiny.MixedPolicy(planner), planner


def request_of(pair, tokenizer, length: int, seed: int = 0):
    mlx_model, model = pair
    ids = np.random.default_rng(seed).integers(3, mlx_model.args.vocab_size, length)
    return tiny.Request(model, tokenizer, ids.tolist())


def test_is_long_means_more_tokens_than_the_threshold(pair, tokenizer):
    policy, _ = policy_of(pair[1], long_prefill_token_threshold=16)
    assert policy.is_long(request_of(pair, tokenizer, 17))
    assert not policy.is_long(request_of(pair, tokenizer, 16))
    no_threshold, _ = policy_of(pair[1])
    assert not no_threshold.is_long(request_of(pair, tokenizer, 100))


def test_a_long_prompts_chunks_shrink_within_the_attention_budget(pair, tokenizer):
    policy, _ = policy_of(
        pair[1], long_prefill_token_threshold=16, long_prefill_attention_budget=200
    )
    request = request_of(pair, tokenizer, 40)
    chunks = []
    while request.offset < 40:
        chunks.append(policy.chunk_limit(request, 64))
        request.advance(chunks[-1])
    assert chunks == [14, 8, 6, 5, 5, 2]


def test_chunk_limit_caps_by_size_and_threshold_and_keeps_one_token(pair, tokenizer):
    policy, _ = policy_of(pair[1], long_prefill_token_threshold=16)
    short = request_of(pair, tokenizer, 10)
    assert policy.chunk_limit(short, 4) == 4
    assert policy.chunk_limit(short, None) == 10, "None: no cap from the size"
    long = request_of(pair, tokenizer, 40)
    assert policy.chunk_limit(long, None) == 16, "a long prompt: at most the threshold"
    assert policy.chunk_limit(long, 8) == 8
    tight, _ = policy_of(
        pair[1], long_prefill_token_threshold=16, long_prefill_attention_budget=10
    )
    long.advance(30)
    assert tight.chunk_limit(long, None) == 1, "always at least one token"


def test_may_start_keeps_the_partial_prefills_within_both_limits(pair, tokenizer):
    policy, planner = policy_of(
        pair[1],
        long_prefill_token_threshold=16,
        max_num_partial_prefills=2,
        max_long_partial_prefills=1,
    )
    long_a, long_b = (request_of(pair, tokenizer, 40, seed) for seed in (1, 2))
    short_a, short_b = (request_of(pair, tokenizer, 8, seed) for seed in (3, 4))
    for request in (long_a, long_b, short_a, short_b):
        planner.add(request)
    started = []
    assert policy.may_start(long_a, started)
    started.append(long_a)  # planned this step: it counts as partly prefilled
    assert policy.may_start(long_a, started), "a started request goes on"
    assert not policy.may_start(long_b, started), "one long partial prefill at most"
    assert policy.may_start(short_a, started)
    started.append(short_a)
    assert not policy.may_start(short_b, started), "two partial prefills at most"
    long_b.advance(5)  # a request with offset > 0 has started: it goes on
    assert policy.may_start(long_b, started)


def test_may_start_counts_only_the_partial_prefills_in_started(pair, tokenizer):
    """may_start counts as partly prefilled only the waiting requests in the
    `started` list it is given and not prefill-done: a request with offset > 0 that
    the caller left out does not count, nor does one in `started` that is
    prefilled or not waiting."""
    policy, planner = policy_of(
        pair[1],
        long_prefill_token_threshold=16,
        max_num_partial_prefills=2,
        max_long_partial_prefills=1,
    )
    partial, prefilled = (request_of(pair, tokenizer, 8, seed) for seed in (1, 2))
    long_partial = request_of(pair, tokenizer, 40, 3)
    short, long = request_of(pair, tokenizer, 8, 4), request_of(pair, tokenizer, 40, 5)
    for request in (partial, prefilled, long_partial, short, long):
        planner.add(request)
    partial.advance(3)
    long_partial.advance(20)
    prefilled.advance(8)
    # Both have offset > 0, but the caller did not list them: neither counts.
    assert policy.may_start(short, [])
    assert policy.may_start(long, []), "a long one not in started is not counted"
    assert not policy.may_start(long, [long_partial]), "one long partial at most"
    assert not policy.may_start(short, [partial, long_partial]), "two at most"
    assert policy.may_start(short, [partial, prefilled]), "prefilled: not partial"
    not_waiting = request_of(pair, tokenizer, 8, 6)  # never added to the planner
    not_waiting.advance(3)
    assert policy.may_start(short, [partial, not_waiting]), "only waiting ones count"
