"""Week 3 Day 3: prefix caching.

Chain hashes, the pool's named blocks (lookup, remember, LRU eviction), and the
engine with prefix_caching=True: prompts sharing random prefixes get mlx-lm's greedy
tokens for each prompt alone, as with caching off; a request admitted after another
finished starts its prefill after exactly the full blocks they share (never its last
token); shared blocks are never written; a pool small enough to evict and preempt
changes no token; and after a run every block is free or cached, the cached ones
exactly the named ones.
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base import SamplingOptions

from .helpers import assert_like_mlx_lm, assert_prompt_logprobs, token_ids
from .paged_checks import assert_pool_empty, run_engine
from .solution import tiny


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- names and the pool -----------------------------------------------------------


@pytest.mark.task(1)
def test_chain_hash_names_a_block_by_everything_before_it():
    first = tiny.chain_hash(None, [1, 2, 3])
    assert first == tiny.chain_hash(None, [1, 2, 3])
    assert first != tiny.chain_hash(None, [1, 2, 4])
    assert first != tiny.chain_hash(None, [3, 2, 1])
    second = tiny.chain_hash(first, [4, 5, 6])
    assert second != tiny.chain_hash(tiny.chain_hash(None, [9, 2, 3]), [4, 5, 6])
    assert second != tiny.chain_hash(None, [4, 5, 6])
    assert tiny.chain_hash(None, [2**40]) != tiny.chain_hash(None, [0])


@pytest.mark.task(1)
def test_pool_finds_the_longest_cached_chain_and_evicts_least_recent_first():
    size = 2
    pool = tiny.BlockPool(5, size)
    tokens = [7, 8, 9, 10, 11, 12]
    blocks = pool.allocate(3)
    parent = None
    for i, block in enumerate(blocks):
        parent = tiny.chain_hash(parent, tokens[i * size : (i + 1) * size])
        pool.remember(block, parent)
    found = pool.lookup(tokens + [13])
    assert found.blocks == blocks and len(found.hashes) == 3
    assert [pool.refcounts[b] for b in blocks] == [2, 2, 2]
    pool.release(found.blocks)
    assert pool.lookup([7, 8, 9, 99]).blocks == blocks[:1], "a chain stops at a miss"
    assert pool.lookup([8, 7]).blocks == []
    # Nobody holds them now: cached, given back tail first, so the tail is the
    # least recently used.
    pool.release(blocks[1:])
    pool.release(blocks[:1])
    pool.release(blocks[:1])  # its lookup's hold, then its own: used last
    assert list(pool.cached) == [blocks[2], blocks[1], blocks[0]]
    assert pool.available == 5 and pool.in_use == 0
    # A cached block is reused before the pool takes memory for a new id.
    fresh = pool.allocate(1)
    assert fresh == [blocks[2]] and blocks[2] not in pool.hash_of
    assert pool.high_water == 3
    assert pool.lookup(tokens).blocks == blocks[:2], "its chain lost its tail only"
    pool.release(blocks[:2])
    pool.release(fresh)  # unnamed: free, and reused first
    assert pool.allocate(1) == fresh
    assert set(pool.cached) == set(pool.hash_of) == {blocks[0], blocks[1]}
    more = pool.allocate(3)  # the least recently used cached block, then new ids
    assert more == [blocks[1], blocks[0], 3] and pool.high_water == 4
    assert pool.hash_of == {} and pool.available == 1


@pytest.mark.task(1)
def test_a_name_taken_keeps_its_first_block():
    pool = tiny.BlockPool(3, 2)
    a, b = pool.allocate(2)
    name = tiny.chain_hash(None, [1, 2])
    pool.remember(a, name)
    pool.remember(b, name)
    assert pool.block_of[name] == a and b not in pool.hash_of
    pool.release([a, b])
    assert list(pool.cached) == [a] and b in pool.free


# --- the engine with prefix caching -----------------------------------------------


@pytest.mark.task(2)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_prefix_caching_changes_no_token(random_pairs, tokenizer, data):
    """Prompts built from a few random prefixes and random tails, arriving over
    several steps: with caching on and off, every request gets mlx-lm's tokens for
    its prompt alone; with it on, cached_tokens is whole blocks of a prefix that an
    earlier prompt shares, never the last token."""
    index = data.draw(st.integers(0, len(random_pairs) - 1), label="model")
    mlx_model, model = random_pairs[index]
    vocab = mlx_model.args.vocab_size
    ids = st.integers(0, vocab - 1)
    block_size = data.draw(st.sampled_from([1, 3, 16]), label="block_size")
    prefixes = data.draw(
        st.lists(st.lists(ids, min_size=0, max_size=36), min_size=1, max_size=3),
        label="prefixes",
    )
    prompts = [
        data.draw(st.sampled_from(prefixes)) + data.draw(st.lists(ids, max_size=6))
        for _ in range(data.draw(st.integers(1, 6), label="requests"))
    ]
    prompts = [p or [0] for p in prompts]
    specs = [
        tiny.PromptSpec(p, arrival_step=data.draw(st.integers(0, 12))) for p in prompts
    ]
    batch_size = data.draw(st.integers(1, 4), label="batch_size")
    policy = data.draw(st.sampled_from(["alternate", "mixed"]), label="policy")
    token_budget = None
    if policy == "mixed":
        token_budget = data.draw(st.sampled_from([batch_size + 1, 16, None]))
    max_tokens = data.draw(st.integers(1, 6), label="max_tokens")
    prefill_step = data.draw(st.sampled_from([4, None]), label="step")
    runs = {}
    for caching in (False, True):
        engine = tiny.Engine(
            model,
            tokenizer,
            batch_size=batch_size,
            max_seq_len=64,
            prefill_step=prefill_step,
            policy=policy,
            token_budget=token_budget,
            max_tokens=max_tokens,
            kv_cache="paged",
            block_size=block_size,
            prefix_caching=caching,
        )
        runs[caching] = run_engine(engine, specs)
        assert_pool_empty(engine)
    off, on = runs[False], runs[True]
    assert_like_mlx_lm(on, mlx_model, prompts, max_tokens, tokenizer)
    assert_like_mlx_lm(off, mlx_model, prompts, max_tokens, tokenizer)
    for i, (prompt, result) in enumerate(zip(prompts, on)):
        assert off[i].cached_tokens == 0
        cached = result.cached_tokens
        assert cached == result.metrics.cached_tokens
        assert cached % block_size == 0 and cached <= len(prompt) - 1
        # What the others' caches held: their prompts, then their tokens.
        others = [p + r.tokens for j, (p, r) in enumerate(zip(prompts, on)) if j != i]
        assert cached <= max((shared_prefix(prompt, p) for p in others), default=0)
    metrics = engine.metrics
    assert metrics.prefix_prompt_tokens == sum(len(p) for p in prompts)
    assert metrics.prefix_cached_tokens == sum(r.cached_tokens for r in on)
    if metrics.preemptions == 0:  # a preempted request computes its tokens again
        computed = sum(len(p) - r.cached_tokens for p, r in zip(prompts, on))
        assert metrics.prefill_tokens == computed


@pytest.mark.task(2)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_a_later_request_starts_after_the_blocks_it_shares(pair, tokenizer, block_size):
    """One request at a time: the second starts its prefill after the full blocks
    it shares with the first (its prompt minus at least one token), computes only
    the rest, and gets mlx-lm's tokens; the same prompt again recomputes only its
    last block's tokens."""
    mlx_model, model = pair
    rng = np.random.default_rng(block_size)
    vocab = mlx_model.args.vocab_size
    common = token_ids(rng, vocab, 37)
    prompts = [
        common + token_ids(rng, vocab, 5),
        common + token_ids(rng, vocab, 9),
        common + token_ids(rng, vocab, 9),
    ]
    prompts.append(list(prompts[2]))
    specs = [tiny.PromptSpec(p, arrival_step=12 * i) for i, p in enumerate(prompts)]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=8,
        policy="mixed",
        max_tokens=4,
        kv_cache="paged",
        block_size=block_size,
    )
    chunks = []
    engine.on_forward = lambda record: chunks.extend(record.chunks)
    results = run_engine(engine, specs)
    assert_like_mlx_lm(results, mlx_model, prompts, 4, tokenizer)
    expected = [0]
    for i in range(1, 4):
        # Earlier requests cached their prompts, then their tokens.
        earlier = [p + r.tokens for p, r in zip(prompts[:i], results)]
        shared = max(shared_prefix(prompts[i], p) for p in earlier)
        expected.append(min(shared, len(prompts[i]) - 1) // block_size * block_size)
    assert expected[3] == (len(prompts[3]) - 1) // block_size * block_size
    assert [r.cached_tokens for r in results] == expected
    computed = {}
    for request_id, tokens in chunks:
        computed[request_id] = computed.get(request_id, 0) + tokens
    assert [computed[i] for i in range(4)] == [
        len(p) - c for p, c in zip(prompts, expected)
    ]
    assert engine.metrics.prefix_cache_hit_rate == pytest.approx(
        sum(expected) / sum(len(p) for p in prompts)
    )
    assert_pool_empty(engine)


@pytest.mark.task(2)
def test_shared_blocks_are_never_written(pair, tokenizer):
    """The keys and values of A's cached blocks are the same bytes after B, which
    shares them, has prefilled and decoded beside them."""
    mlx_model, model = pair
    rng = np.random.default_rng(11)
    vocab = mlx_model.args.vocab_size
    a = token_ids(rng, vocab, 20)
    b = a[:14] + token_ids(rng, vocab, 4)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=None,
        policy="mixed",
        max_tokens=8,
        kv_cache="paged",
        block_size=4,
    )
    run_engine(engine, [a])
    shared = engine.kv.pool.lookup(b[:-1])
    engine.kv.pool.release(shared.blocks)
    assert len(shared.blocks) == 3
    blocks = mx.array(shared.blocks)
    before = [
        (np.array(layer.keys[blocks]), np.array(layer.values[blocks]))
        for layer in engine.kv.layer_blocks
    ]
    (result,) = run_engine(engine, [b])
    assert result.cached_tokens == 12
    assert_like_mlx_lm([result], mlx_model, [b], 8, tokenizer)
    for layer, (keys, values) in zip(engine.kv.layer_blocks, before):
        np.testing.assert_array_equal(np.array(layer.keys[blocks]), keys)
        np.testing.assert_array_equal(np.array(layer.values[blocks]), values)
    assert_pool_empty(engine)


@pytest.mark.task(2)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_blocks_shared_with_a_running_request_are_never_written(
    pair, tokenizer, no_eos, policy
):
    """B shares A's first three blocks while A still decodes: both hold them
    (refcount 2), both get mlx-lm's tokens, and the blocks' bytes never change."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(13)
    vocab = mlx_model.args.vocab_size
    a = token_ids(rng, vocab, 20)
    b = a[:14] + token_ids(rng, vocab, 4)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=None,
        policy=policy,
        max_tokens=8,
        sampler=sampler,
        kv_cache="paged",
        block_size=4,
    )
    results = {}

    def step():
        for output in engine.step():
            if output.result is not None:
                results[output.request_id] = output.result

    first = engine.add_request(a)
    while not engine.planner.slots[0]:  # A prefilled, its prompt's full blocks named
        step()
    [table] = engine.kv.tables.values()
    blocks = mx.array(table.blocks[:3])
    before = [
        (np.array(layer.keys[blocks]), np.array(layer.values[blocks]))
        for layer in engine.kv.layer_blocks
    ]
    second = engine.add_request(b)
    most_holders = 0
    for _ in range(100):
        if not engine.has_unfinished():
            break
        step()
        most_holders = max(most_holders, engine.kv.pool.refcounts[table.blocks[0]])
    assert most_holders == 2, "B ran beside A, holding A's blocks"
    assert results[second].cached_tokens == 12
    assert_like_mlx_lm(
        [results[first], results[second]], mlx_model, [a, b], 8, tokenizer, banned
    )
    for layer, (keys, values) in zip(engine.kv.layer_blocks, before):
        np.testing.assert_array_equal(np.array(layer.keys[blocks]), keys)
        np.testing.assert_array_equal(np.array(layer.values[blocks]), values)
    assert_pool_empty(engine)


@pytest.mark.task(2)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_eviction_and_preemption_with_caching_change_no_token(
    pair, tokenizer, no_eos, policy
):
    """Six requests on two shared prefixes in a pool of one request's blocks: cached
    blocks are evicted and requests preempted, and each still gets its tokens."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(12)
    vocab = mlx_model.args.vocab_size
    heads = [token_ids(rng, vocab, 13), token_ids(rng, vocab, 8)]
    prompts = [heads[i % 2] + token_ids(rng, vocab, 2 + i) for i in range(6)]
    specs = [tiny.PromptSpec(p, arrival_step=3 * i) for i, p in enumerate(prompts)]
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=3,
        max_seq_len=40,
        prefill_step=4,
        policy=policy,
        max_tokens=10,
        sampler=sampler,
        kv_cache="paged",
        block_size=2,
        num_blocks=20,
    )
    results = run_engine(engine, specs)
    assert engine.metrics.preemptions > 0
    assert engine.metrics.prefix_cached_tokens > 0
    assert_like_mlx_lm(results, mlx_model, prompts, 10, tokenizer, banned)
    assert_pool_empty(engine)


@pytest.mark.task(2)
def test_embedded_model_chat_turns_reuse_the_conversation(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    """A two-turn chat resent whole: the second turn's prompt starts with the first,
    its prefill starts after their shared full blocks, and both match mlx-lm."""
    tokenizer = embedded_model[1]
    model = embedded_week2_model(True)
    messages = [{"role": "user", "content": "Name a fruit."}]
    first = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=256,
        policy="mixed",
        max_tokens=6,
        kv_cache="paged",
    )
    (answer,) = run_engine(engine, [first])
    messages += [
        {"role": "assistant", "content": answer.text},
        {"role": "user", "content": "And a vegetable?"},
    ]
    second = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    (reply,) = run_engine(engine, [second])
    shared = shared_prefix(first, second)
    assert reply.cached_tokens == min(shared, len(second) - 1) // 16 * 16 > 0
    assert_like_mlx_lm(
        [answer, reply], embedded_float32_reference, [first, second], 6, tokenizer
    )
    assert engine.metrics.prefix_cache_hit_rate > 0
    assert_pool_empty(engine)


@pytest.mark.task(2)
def test_a_follow_up_turn_reuses_the_answer_blocks(pair, tokenizer, no_eos):
    """A follow-up that resends a finished request's prompt and its answer finds
    every full block of both cached: the answer's blocks were named as they filled,
    not only the prompt's. Its tokens are still mlx-lm's."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(21)
    vocab = mlx_model.args.vocab_size
    first = token_ids(rng, vocab, 10)
    engine = tiny.Engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=96,
        prefill_step=8,
        policy="mixed",
        max_tokens=17,
        sampler=sampler,
        kv_cache="paged",
        block_size=4,
    )
    (answer,) = run_engine(engine, [first])
    second = first + answer.tokens + token_ids(rng, vocab, 6)
    (reply,) = run_engine(engine, [second])
    computed = len(first) + len(answer.tokens) - 1  # the last token was never fed
    assert reply.cached_tokens == computed // 4 * 4 == 24
    assert reply.cached_tokens > len(first) // 4 * 4, "only prompt blocks were named"
    assert_like_mlx_lm(
        [answer, reply], mlx_model, [first, second], 17, tokenizer, banned
    )
    assert_pool_empty(engine)


@pytest.mark.task(2)
def test_a_request_asking_prompt_logprobs_computes_its_whole_prompt(pair, tokenizer):
    """A cached position has no logits: a request that wants its prompt's logprobs
    is not served from the cache (cached_prefix gives it nothing), gets every
    position's logprob, and names its blocks for the next request, which is."""
    mlx_model, model = pair
    prompt = token_ids(np.random.default_rng(4), mlx_model.args.vocab_size, 21)
    scored = SamplingOptions(prompt_logprobs=1)
    specs = [
        tiny.PromptSpec(prompt),
        tiny.PromptSpec(prompt, options=scored, arrival_step=10),
        tiny.PromptSpec(prompt, arrival_step=20),
    ]
    engine = tiny.Engine(
        model, tokenizer, max_tokens=2, kv_cache="paged", block_size=4, policy="mixed"
    )
    first, logged, last = run_engine(engine, specs)
    assert [r.cached_tokens for r in (first, logged, last)] == [0, 0, 20]
    assert_prompt_logprobs(logged.prompt_logprobs, prompt, mlx_model, 1)
    assert_pool_empty(engine)
