"""Week 3 Day 2: the paged KV cache.

The block pool's bookkeeping (free list, refcounts), one request's keys read back
through a scattered block table, the decode rows' batch view, and the engine on
kv_cache="paged": every request gets mlx-lm's greedy tokens for its prompt alone
(random Qwen2 and Llama models at unusual sizes and the embedded model), whatever the
block size, policy, budget or batch size; a pool small enough to preempt gives the
same tokens; and after every step each block is held, free or cached exactly once.
Prefix caching is off here (prefix_caching=False): it is day 3's.
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny_llm_base import EngineConfig

from .helpers import assert_like_mlx_lm, assert_same_tokens, expected_tokens, token_ids
from .paged_checks import assert_pool_empty, check_pool, run_engine
from .solution import tiny

BLOCK_SIZES = [1, 3, 16]


def paged_engine(model, tokenizer, **settings):
    return tiny.Engine(
        model, tokenizer, kv_cache="paged", prefix_caching=False, **settings
    )


# --- the block pool ----------------------------------------------------------------


@pytest.mark.task(1)
def test_blocks_needed():
    for tokens, size, blocks in [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (7, 1, 7)]:
        assert tiny.blocks_needed(tokens, size) == blocks


@pytest.mark.task(1)
def test_pool_hands_out_each_block_once_and_takes_it_back():
    pool = tiny.BlockPool(6, 4)
    assert pool.available == 6 and pool.in_use == 0
    first = pool.allocate(4)
    assert len(set(first)) == 4 and set(first) <= set(range(6))
    assert all(pool.refcounts[b] == 1 for b in first)
    assert pool.available == 2 and pool.in_use == 4
    with pytest.raises(ValueError) as error:
        pool.allocate(3)
    assert str(error.value) == (
        "3 blocks asked, 2 available: check available first, or preempt a request"
    )
    assert pool.available == 2, "a refused allocation takes nothing"
    second = pool.allocate(2)
    assert not set(first) & set(second)
    pool.release(first[:2])
    assert pool.available == 2 and all(pool.refcounts[b] == 0 for b in first[:2])
    third = pool.allocate(2)
    assert set(third) == set(first[:2]), "released blocks are handed out again"
    pool.release(first[2:] + second + third)
    assert pool.available == 6 and pool.in_use == 0


# --- one request's keys through its block table -----------------------------------


@pytest.mark.task(2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_cache_reads_back_every_key_in_order(block_size):
    """Chunks of uneven length written through a shuffled block table read back as
    the concatenation of everything written, with the chunk mask's rule."""
    H, D, num_blocks = 3, 5, 40
    rng = np.random.default_rng(block_size)
    lengths = [1, 4, 2, 7, 1, 1, 5]
    width = tiny.blocks_needed(sum(lengths), block_size)
    table = tiny.BlockTable([int(b) for b in rng.permutation(num_blocks)[:width]])
    layer = tiny.LayerBlocks(num_blocks, block_size)
    cache = tiny.PagedKvCache(layer, table)
    written_keys, written_values = [], []
    for L in lengths:
        keys = rng.standard_normal((1, H, L, D)).astype(np.float32)
        values = rng.standard_normal((1, H, L, D)).astype(np.float32)
        written_keys.append(keys)
        written_values.append(values)
        all_keys, all_values, mask = cache.update_and_fetch(
            mx.array(keys), mx.array(values)
        )
        S = sum(k.shape[2] for k in written_keys)
        assert cache.offset == S
        np.testing.assert_array_equal(
            np.array(all_keys), np.concatenate(written_keys, axis=2)
        )
        np.testing.assert_array_equal(
            np.array(all_values), np.concatenate(written_values, axis=2)
        )
        assert mask == ("causal" if L > 1 else None)
    assert max(table.blocks) < layer.capacity <= num_blocks
    unused = sorted(set(range(layer.capacity)) - set(table.blocks))
    assert not np.array(layer.keys)[unused].any(), "a write left its blocks"


@pytest.mark.task(2)
def test_paged_cache_refuses_to_write_past_its_blocks():
    table = tiny.BlockTable([0, 1])
    cache = tiny.PagedKvCache(tiny.LayerBlocks(4, 3), table)
    with pytest.raises(ValueError, match="reserve"):
        cache.update_and_fetch(mx.zeros((1, 2, 7, 4)), mx.zeros((1, 2, 7, 4)))


@pytest.mark.task(3)
def test_batch_view_gives_each_row_its_own_keys_and_mask():
    """Three requests of different lengths in slots 0, 2 and 3 (slot 1 empty): one
    decode token each. Attention through the view equals attention over each
    request's own keys alone."""
    H, D, block_size = 2, 4, 3
    rng = np.random.default_rng(0)
    layer = tiny.LayerBlocks(30, block_size)
    batch = tiny.PagedBatchingKvCache(4, 64)
    free = [int(b) for b in rng.permutation(30)]
    history = {}
    for slot, length in [(0, 5), (2, 9), (3, 1)]:
        blocks = [free.pop() for _ in range(tiny.blocks_needed(length + 1, 3))]
        view = tiny.PagedKvCache(layer, tiny.BlockTable(blocks))
        keys = rng.standard_normal((1, H, length, D)).astype(np.float32)
        values = rng.standard_normal((1, H, length, D)).astype(np.float32)
        view.update_and_fetch(mx.array(keys), mx.array(values))
        batch.add_request(view, slot)
        history[slot] = (keys, values)
    assert batch.offset == [5, 0, 9, 1] and batch.rows == 4
    q = rng.standard_normal((4, H, 1, D)).astype(np.float32)
    new_k = rng.standard_normal((4, H, 1, D)).astype(np.float32)
    new_v = rng.standard_normal((4, H, 1, D)).astype(np.float32)
    keys, values, mask = batch.update_and_fetch(mx.array(new_k), mx.array(new_v))
    assert batch.offset == [6, 0, 10, 2]
    out = mx.fast.scaled_dot_product_attention(
        mx.array(q), keys, values, scale=D**-0.5, mask=mask
    )
    for slot, (old_k, old_v) in history.items():
        k = np.concatenate([old_k[0], new_k[slot]], axis=1)[None]
        v = np.concatenate([old_v[0], new_v[slot]], axis=1)[None]
        alone = mx.fast.scaled_dot_product_attention(
            mx.array(q[slot : slot + 1]), mx.array(k), mx.array(v), scale=D**-0.5
        )
        np.testing.assert_allclose(np.array(out[slot]), np.array(alone[0]), atol=1e-5)
    assert np.isfinite(np.array(out)).all(), "the empty row made NaN"
    batch.remove_request(2)
    assert batch.offset == [6, 0, 0, 2]
    with pytest.raises(ValueError, match="in use"):
        batch.add_request(tiny.PagedKvCache(layer, tiny.BlockTable([])), 0)


# --- the engine on the paged cache -------------------------------------------------


@pytest.mark.task(4)
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_paged_engine_matches_mlx_lm(random_pairs, tokenizer, data):
    index = data.draw(st.integers(0, len(random_pairs) - 1), label="model")
    mlx_model, model = random_pairs[index]
    vocab = mlx_model.args.vocab_size
    block_size = data.draw(st.sampled_from(BLOCK_SIZES), label="block_size")
    batch_size = data.draw(st.integers(1, 4), label="batch_size")
    policy = data.draw(st.sampled_from(["alternate", "mixed"]), label="policy")
    token_budget = None
    if policy == "mixed":
        token_budget = data.draw(
            st.sampled_from([batch_size + 1, 16, None]), label="token_budget"
        )
    max_seq_len = 48
    one_request = tiny.blocks_needed(max_seq_len, block_size)
    num_blocks = data.draw(
        st.sampled_from([one_request, 2 * one_request, None]), label="num_blocks"
    )
    prompts = data.draw(
        st.lists(
            st.lists(st.integers(0, vocab - 1), min_size=1, max_size=30),
            min_size=1,
            max_size=6,
        ),
        label="prompts",
    )
    max_tokens = data.draw(st.integers(1, 8), label="max_tokens")
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=batch_size,
        max_seq_len=max_seq_len,
        prefill_step=data.draw(st.sampled_from([2, 8, None]), label="step"),
        policy=policy,
        token_budget=token_budget,
        max_tokens=max_tokens,
        block_size=block_size,
        num_blocks=num_blocks,
    )
    results = run_engine(engine, prompts)
    assert_like_mlx_lm(results, mlx_model, prompts, max_tokens, tokenizer)
    assert_pool_empty(engine)
    assert not engine.kv.pool.cached, "nothing is cached without prefix caching"


@pytest.mark.task(4)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_a_small_pool_preempts_and_recomputes_without_changing_tokens(
    pair, tokenizer, no_eos, policy
):
    """Five requests whose prompts and answers need 12 blocks of 3 each, in a pool
    of 16 (one max_seq_len request's worth): decodes run it dry, the newest request
    is preempted and later recomputes its prompt and tokens. Every request still
    gets mlx-lm's tokens, and nothing leaks."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(5)
    prompts = [
        token_ids(rng, mlx_model.args.vocab_size, n) for n in (20, 17, 9, 25, 14)
    ]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=4,
        max_seq_len=48,
        prefill_step=8,
        policy=policy,
        max_tokens=12,
        sampler=sampler,
        block_size=3,
        num_blocks=16,
    )
    results = run_engine(engine, prompts)
    assert engine.metrics.preemptions > 0, "the pool never ran dry"
    assert sum(r.metrics.preemptions for r in results) == engine.metrics.preemptions
    assert engine.metrics.kv_peak_blocks_in_use <= 16
    assert_like_mlx_lm(results, mlx_model, prompts, 12, tokenizer, banned)
    for result in results:
        assert result.metrics.generated_tokens == 12
        assert len(result.metrics.token_times) == 12
    assert_pool_empty(engine)


@pytest.mark.task(4)
def test_a_preempted_request_that_is_the_newest_preempts_itself(
    pair, tokenizer, no_eos
):
    """Two requests and a pool of exactly one request's blocks: the older one always
    goes on (it is never the newest), the newer one waits and recomputes; nothing
    deadlocks."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(6)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (10, 12)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=32,
        prefill_step=None,
        policy="mixed",
        max_tokens=20,
        sampler=sampler,
        block_size=4,
        num_blocks=8,
    )
    results = run_engine(engine, prompts)
    assert results[0].metrics.preemptions == 0, "the oldest request was preempted"
    assert results[1].metrics.preemptions > 0
    assert_like_mlx_lm(results, mlx_model, prompts, 20, tokenizer, banned)
    assert_pool_empty(engine)


def kv_bytes_per_token(mlx_model, element_size: int = 4) -> int:
    """Keys and values of one token over all layers, from mlx-lm's config."""
    args = mlx_model.args
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // (
        args.num_attention_heads
    )
    heads = args.num_key_value_heads
    return 2 * heads * head_dim * element_size * args.num_hidden_layers


@pytest.mark.task(4)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_paged_memory_follows_the_tokens_computed(pair, tokenizer, no_eos, policy):
    """After every step a request holds ceil(offset / block_size) blocks: blocks come
    with the tokens a step computes, not a whole prompt up front, so a request still
    prefilling holds none for the part it has not reached. The pool's size is the
    kv_memory budget over one block's bytes, and its arrays hold no more blocks than
    it has handed out (doubling from 256 positions)."""
    mlx_model, model = pair
    sampler, _ = no_eos
    rng = np.random.default_rng(7)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (11, 3, 30)]
    per_token = kv_bytes_per_token(mlx_model)
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=4,
        policy=policy,
        max_tokens=6,
        sampler=sampler,
        block_size=4,
        kv_memory=500 * 4 * per_token + 3,
    )
    assert engine.metrics.kv_dense_tokens == 2 * 64
    assert engine.metrics.kv_blocks_total == 500
    seen, partial = [], []

    def check(engine):
        for request, table in engine.kv.tables.items():
            assert len(table.blocks) == tiny.blocks_needed(request.offset, 4)
            if not request.is_prefill_done and request.offset:
                partial.append(request)
        in_use = sum(len(table.blocks) for table in engine.kv.tables.values())
        assert engine.kv.pool.in_use == in_use
        assert engine.metrics.kv_blocks_in_use == in_use
        for layer in engine.kv.layer_blocks:
            if layer.keys is not None:
                assert layer.capacity == max(64, engine.kv.pool.high_water)
        assert engine.metrics.kv_pool_bytes == sum(
            layer.keys.nbytes + layer.values.nbytes
            for layer in engine.kv.layer_blocks
            if layer.keys is not None
        )
        seen.append(engine.kv.pool.in_use)

    run_engine(engine, prompts, check)
    assert partial, "no step saw a request part way through its prompt"
    assert engine.metrics.kv_peak_blocks_in_use == max(seen)
    assert engine.metrics.kv_peak_tokens == 4 * max(seen)
    assert engine.metrics.kv_bytes_per_token == per_token
    assert engine.metrics.kv_pool_bytes == 64 * 4 * per_token
    assert engine.metrics.kv_blocks_in_use == 0
    assert_pool_empty(engine)


@pytest.mark.task(4)
def test_abort_and_failures_give_blocks_back(pair, tokenizer, no_eos):
    """Aborting a request mid-prefill and mid-decode, and a request whose sampler
    fails, leave no block held."""
    mlx_model, model = pair
    sampler, _ = no_eos
    rng = np.random.default_rng(8)
    vocab = mlx_model.args.vocab_size

    def broken(logprobs):
        raise RuntimeError("sampler broke")

    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=4,
        policy="mixed",
        max_tokens=10,
        sampler=sampler,
        block_size=4,
    )
    decoding = engine.add_request(token_ids(rng, vocab, 6))
    prefilling = engine.add_request(token_ids(rng, vocab, 30))
    failing = engine.add_request(
        tiny.PromptSpec(token_ids(rng, vocab, 5), sampler=broken)
    )
    finished = {}

    def step():
        for output in engine.step():
            if output.result is not None:
                finished[output.request_id] = output.result

    for _ in range(3):
        step()
    assert engine.kv.tables, "somebody holds blocks"
    engine.abort(decoding)
    engine.abort(prefilling)
    for _ in range(50):
        if not engine.has_unfinished():
            break
        step()
    assert finished[decoding].finish_reason == "abort"
    assert finished[prefilling].finish_reason == "abort"
    assert finished[failing].finish_reason == "error"
    assert "sampler broke" in finished[failing].error
    assert_pool_empty(engine)


@pytest.mark.task(4)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_peak_counts_blocks_given_back_in_the_same_step(
    pair, tokenizer, no_eos, policy
):
    """Two 30-token prompts answered by their first token hold their blocks for one
    forward only: the peak still counts them (ceil(30 / 4) = 8 blocks each)."""
    mlx_model, model = pair
    rng = np.random.default_rng(12)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, 30) for _ in range(2)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=None,
        policy=policy,
        max_tokens=1,
        sampler=no_eos[0],
        block_size=4,
    )
    results = run_engine(engine, prompts)
    assert [len(r.tokens) for r in results] == [1, 1]
    held_together = policy == "mixed"  # one forward prefills both
    assert engine.metrics.kv_peak_blocks_in_use == (16 if held_together else 8)
    assert engine.metrics.kv_blocks_in_use == 0
    assert_pool_empty(engine)


@pytest.mark.task(4)
def test_embedded_model_on_the_paged_cache(
    embedded_model, embedded_week2_model, embedded_float32_reference
):
    tokenizer = embedded_model[1]
    model = embedded_week2_model(True)
    texts = ["The capital of France is", "Red, green and", "One, two, three,"]
    prompts = [tokenizer.encode(text) for text in texts]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=64,
        prefill_step=4,
        policy="mixed",
        max_tokens=5,
        block_size=3,
    )
    results = run_engine(engine, prompts)
    assert_like_mlx_lm(results, embedded_float32_reference, prompts, 5, tokenizer)
    assert_pool_empty(engine)


@pytest.mark.task(4)
@pytest.mark.parametrize(
    "settings, error, name",
    [
        (dict(kv_cache="pages"), ValueError, "kv_cache"),
        (dict(kv_cache="paged", block_size=0), ValueError, "block_size"),
        (dict(kv_cache="paged", block_size=2.0), TypeError, "block_size"),
        (dict(kv_cache="paged", block_size=4, num_blocks=15), ValueError, "num_blocks"),
        (dict(kv_cache="paged", prefix_caching="yes"), TypeError, "prefix_caching"),
        (dict(kv_cache="paged", kv_memory="12 parsecs"), ValueError, "kv_memory"),
        (dict(kv_cache="paged", kv_memory=0), ValueError, "kv_memory"),
        (dict(kv_cache="paged", kv_memory=1.5), TypeError, "kv_memory"),
        (dict(kv_cache="paged", kv_memory=True), TypeError, "kv_memory"),
        (dict(kv_cache="paged", kv_memory="1GiB", num_blocks=64), ValueError, "one"),
    ],
)
def test_engine_rejects_bad_kv_cache_settings(pair, tokenizer, settings, error, name):
    _, model = pair
    with pytest.raises(error, match=name):
        tiny.Engine(model, tokenizer, max_seq_len=64, **settings)


@pytest.mark.task(4)
def test_a_dense_cache_past_kv_memory_is_refused_with_the_batch_size_that_fits(
    pair, tokenizer
):
    """kv_memory bounds the dense cache too: batch_size x max_seq_len positions
    must fit it, and the message names the batch_size that does."""
    mlx_model, model = pair
    budget = 2 * 64 * kv_bytes_per_token(mlx_model) + 5
    with pytest.raises(ValueError, match="pass batch_size 2 or less"):
        tiny.Engine(model, tokenizer, batch_size=3, max_seq_len=64, kv_memory=budget)
    engine = tiny.Engine(
        model, tokenizer, batch_size=2, max_seq_len=64, kv_memory=budget
    )
    assert engine.config.kv_memory == budget
    with pytest.raises(ValueError, match="kv_memory of at least .* for one request"):
        tiny.Engine(model, tokenizer, max_seq_len=64, kv_memory=budget // 3)


@pytest.mark.task(2)
def test_layer_arrays_grow_by_doubling_and_keep_what_was_written():
    """The arrays hold 256 positions' worth of blocks at the first write, double to
    cover a higher block id (at least that block + 1, at most num_blocks), and keep
    every key written before."""
    H, D, size = 2, 3, 4
    layer = tiny.LayerBlocks(500, size)
    rng = np.random.default_rng(3)
    written = {}
    for block, capacity in [(0, 64), (70, 128), (300, 301), (490, 500), (5, 500)]:
        rows = rng.standard_normal((2, H, D)).astype(np.float32)
        layer.stage([block, block], [1, 3], mx.array(rows), mx.array(-rows))
        layer.flush()
        assert layer.capacity == layer.keys.shape[0] == capacity
        written[block] = rows
        for b, r in written.items():
            np.testing.assert_array_equal(np.array(layer.keys[b, :, 1]), r[0])
            np.testing.assert_array_equal(np.array(layer.values[b, :, 3]), -r[1])
    with pytest.raises(ValueError, match="past the pool's 500 blocks"):
        layer.stage([500], [0], mx.zeros((1, H, D)), mx.zeros((1, H, D)))
        layer.flush()


@pytest.mark.task(2)
@pytest.mark.parametrize("block_size", [1, 3, 5, 7, 100, 300])
def test_the_first_write_makes_256_positions_worth_of_blocks(block_size):
    """At any block size, the first write makes arrays of min(num_blocks,
    max(the blocks written need, blocks_needed(256, block_size))) blocks: 256
    positions rounded up to whole blocks, not a fixed count of blocks."""
    H, D = 2, 3
    first = -(-256 // block_size)  # 256 positions, rounded up to whole blocks
    for num_blocks, block, capacity in [
        (first + 40, 0, first),
        (first + 40, first + 9, first + 10),
        (first + 40, first + 39, first + 40),
        (max(1, first - 1), 0, max(1, first - 1)),
    ]:
        layer = tiny.LayerBlocks(num_blocks, block_size)
        assert layer.capacity == 0, "no arrays before the first write"
        rows = np.ones((1, H, D), np.float32)
        layer.stage([block], [block_size - 1], mx.array(rows), mx.array(rows))
        layer.flush()
        assert layer.capacity == layer.keys.shape[0] == capacity, (num_blocks, block)
        assert layer.keys.shape == (capacity, H, block_size, D)


@pytest.mark.task(3)
def test_parts_sharing_a_layer_are_written_in_one_scatter():
    """Three parts of one step (two prefilling requests and a decode row) stage
    their keys in one layer; the first read writes all of them at once, and every
    part then reads its own keys with its own mask. A TinyKvFullCache's stage and
    fetch_staged give what update_and_fetch gives."""
    H, D, size = 2, 4, 3
    rng = np.random.default_rng(4)
    layer = tiny.LayerBlocks(40, size)
    views = [tiny.PagedKvCache(layer, tiny.BlockTable([b, b + 10])) for b in (1, 2, 3)]
    batch = tiny.PagedBatchingKvCache(2, 16)
    history = []
    for view, length in zip(views, (2, 4, 1)):
        k = rng.standard_normal((1, H, length, D)).astype(np.float32)
        view.stage(mx.array(k), mx.array(2 * k))
        history.append(k)
    assert len(layer.staged) == 3
    layer.flush()
    batch.add_request(views[2], 1)
    new = [rng.standard_normal((1, H, n, D)).astype(np.float32) for n in (3, 1)]
    decode = rng.standard_normal((2, H, 1, D)).astype(np.float32)
    views[0].stage(mx.array(new[0]), mx.array(2 * new[0]))
    views[1].stage(mx.array(new[1]), mx.array(2 * new[1]))
    batch.stage(mx.array(decode), mx.array(2 * decode))
    assert len(layer.staged) == 3 and batch.offset == [0, 2]
    writes = []
    scatter = layer.flush

    def counted_flush():
        writes.append(len(layer.staged))
        scatter()

    layer.flush = counted_flush
    k0, v0, mask0 = views[0].fetch_staged()
    k1, _, mask1 = views[1].fetch_staged()
    kb, _, maskb = batch.fetch_staged()
    assert writes[0] == 3 and all(n == 0 for n in writes[1:])
    np.testing.assert_array_equal(np.array(k0), np.concatenate([history[0], new[0]], 2))
    np.testing.assert_array_equal(np.array(v0), 2 * np.array(k0))
    np.testing.assert_array_equal(np.array(k1), np.concatenate([history[1], new[1]], 2))
    assert mask0 == "causal" and mask1 is None
    expected = np.concatenate([history[2], decode[1:2]], 2)[0]
    np.testing.assert_array_equal(np.array(kb[1, :, :2]), expected)
    assert maskb.shape == (2, 1, 1, 2)
    full = tiny.TinyKvFullCache()
    k = mx.array(rng.standard_normal((1, H, 5, D)).astype(np.float32))
    full.stage(k, 2 * k)
    keys, values, mask = full.fetch_staged()
    assert full.offset == 5 and mask == "causal"
    np.testing.assert_array_equal(np.array(keys), np.array(k))


@pytest.mark.task(4)
def test_a_mixed_step_writes_each_layer_once(pair, tokenizer, no_eos):
    """Decodes and two prefill chunks in every step: each layer's pool takes one
    write a step, however many parts the step has, and the tokens are mlx-lm's.
    Without the step ahead, so that a step runs one forward (step_ahead.py starts
    the next step's decode forward in this one)."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(9)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (5, 21, 19, 6)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=4,
        max_seq_len=64,
        prefill_step=4,
        policy="mixed",
        max_tokens=8,
        sampler=sampler,
        block_size=4,
        step_ahead=False,
    )
    writes, parts = [0], []  # writes[i]: step i's writes to layer 0
    layer = engine.kv.layer_blocks[0]
    scatter = layer.flush

    def counted_flush():
        writes[-1] += bool(layer.staged)
        scatter()

    layer.flush = counted_flush
    engine.on_forward = lambda record: parts.append(
        len(record.chunks) + bool(record.decodes)
    )
    results = run_engine(engine, prompts, lambda e: (check_pool(e), writes.append(0)))
    assert max(parts) >= 3, "no step mixed decodes with two chunks"
    assert set(writes) <= {0, 1}, writes
    assert sum(writes) == len(parts), "a forward did not write, or wrote twice"
    assert_like_mlx_lm(results, mlx_model, prompts, 8, tokenizer, banned)
    assert_pool_empty(engine)


@pytest.mark.task(4)
def test_a_prefill_chunk_preempts_only_newer_waiting_requests(pair, tokenizer, no_eos):
    """Two long prompts chunked side by side in a pool that holds one and a half of
    them: when the older one's next chunk finds no block, the newer one (still
    prefilling) is preempted, never the older; both get mlx-lm's tokens and nothing
    deadlocks."""
    mlx_model, model = pair
    sampler, banned = no_eos
    rng = np.random.default_rng(10)
    prompts = [token_ids(rng, mlx_model.args.vocab_size, n) for n in (40, 38)]
    engine = paged_engine(
        model,
        tokenizer,
        batch_size=2,
        max_seq_len=48,
        prefill_step=8,
        policy="mixed",
        max_tokens=4,
        sampler=sampler,
        block_size=4,
        num_blocks=16,
    )
    results = run_engine(engine, prompts)
    assert results[0].metrics.preemptions == 0, "the older request was preempted"
    assert results[1].metrics.preemptions > 0, "the pool never ran dry mid-prefill"
    assert_like_mlx_lm(results, mlx_model, prompts, 4, tokenizer, banned)
    assert_pool_empty(engine)


# --- the n choices of one prompt ----------------------------------------------------


@pytest.mark.task(4)
@pytest.mark.parametrize("policy", ["alternate", "mixed"])
def test_the_choices_of_one_prompt_share_its_full_blocks(
    pair, tokenizer, no_eos, policy
):
    """A prompt asked n times: the later choices wait for the first one's prefill,
    then hold its full prompt blocks (refcount n: each counted once in the pool)
    and compute only the rest of the prompt. Greedy, every choice gets the
    prompt's answer alone."""
    mlx_model, model = pair
    sampler, banned = no_eos
    ids = token_ids(np.random.default_rng(3), mlx_model.args.vocab_size, 18)
    n, block_size, shared = 3, 4, 4  # (18 - 1) // 4 full blocks before the last token
    engine = paged_engine(
        model, tokenizer, block_size=4, batch_size=4, policy=policy, sampler=sampler
    )
    request_id = engine.add_request(tiny.PromptSpec(ids, 6, n=n))
    finished, sharing_seen = {}, False
    while engine.has_unfinished():
        for output in engine.step():
            assert output.request_id == request_id
            if output.result is not None:
                finished[output.index] = output.result
        check_pool(engine)
        tables = engine.kv.tables
        choices = [r for r in tables if r.choice.index == 0]
        if len(tables) == n and choices:
            first = tables[choices[0]].blocks[:shared]
            assert all(engine.kv.pool.refcounts[b] == n for b in first)
            held = sum(len(table.blocks) for table in tables.values())
            assert held - engine.kv.pool.in_use == (n - 1) * shared
            sharing_seen = True
    assert sharing_seen, "no step had all choices holding blocks"
    assert engine.metrics.prefill_tokens == len(ids) + (n - 1) * (
        len(ids) - shared * block_size
    )
    expected, gaps = expected_tokens(mlx_model, [ids], 6, tokenizer, banned)[0]
    for index in range(n):
        assert_same_tokens(finished[index].tokens, expected, gaps, f"choice {index}")
    assert_pool_empty(engine)


@pytest.mark.task(4)
def test_a_restarted_later_choice_shares_no_block_of_the_first_choices_answer(
    pair, tokenizer
):
    """A later choice restarted after generating tokens: its prefill_length now
    counts them, but it shares only the first choice's full blocks of the prompt
    ((metrics.prompt_tokens - 1) // block_size), never a block holding the first
    choice's generated tokens, which are not its own."""
    _, model = pair
    config = EngineConfig(
        batch_size=2, max_seq_len=64, kv_cache="paged", block_size=4, num_blocks=32
    )
    kv = tiny.PagedKvManager(model, config)
    prompt = list(range(20, 30))  # 10 tokens: 2 full blocks before the last token
    first = tiny.Request(model, tokenizer, prompt)
    later = tiny.Request(model, tokenizer, prompt, choice=tiny.PromptChoice(1, first))
    assert kv.admit(first) == 0
    assert kv.reserve(first, 17) == 17
    first.advance(17)  # its prompt and 7 generated tokens: 5 blocks, 4 of them full
    assert kv.admit(later) == 8, "the prompt's first 2 blocks are shared"
    later.advance(8)
    kv.release(later)  # preempted after generating 8 tokens of its own
    for token in range(40, 48):
        later.accept(token)
    later.restart()
    assert later.prefill_length == 18 and later.metrics.prompt_tokens == 10
    assert kv.admit(later) == 8, "a restart shares the prompt's 2 blocks, no more"
    first_blocks = kv.tables[first].blocks
    assert kv.tables[later].blocks == first_blocks[:2]
    assert [kv.pool.refcounts[b] for b in first_blocks] == [2, 2, 1, 1, 1]
